"""XHTML narrative rules (R4 Narrative, 2.4.0.1 and the ``txt-1``/``txt-2`` invariants).

``Narrative.div`` must be a well-formed XHTML ``div`` in the XHTML namespace, holding only
the basic HTML formatting elements and attributes the specification lists: no scripts,
forms, frames, objects or styles sheets, no event handler attributes, no ``javascript:``
links, no DTD and no entities of its own (an XML external entity would make a parser
read files or URLs). It must not be empty. It is XML: HTML's named entities
(``&nbsp;``, ``&reg;``) are undefined there, as the reference validator reports.

The XML is read with expat, which neither fetches external entities nor expands
recursive ones once a DTD is refused.
"""

from __future__ import annotations

from xml.parsers import expat

XHTML_NAMESPACE = "http://www.w3.org/1999/xhtml"
# R4 Narrative: "only the basic html formatting elements described in chapters 7-11 and 15
# of the HTML 4.0 standard, <a> elements (either name or href), images and internally
# contained stylesheets" (the reference validator's list).
ALLOWED_ELEMENTS = frozenset({
    "p", "br", "div", "h1", "h2", "h3", "h4", "h5", "h6", "a", "span", "b", "em", "i",
    "strong", "small", "big", "tt", "dfn", "q", "var", "abbr", "acronym", "cite",
    "blockquote", "hr", "address", "bdo", "kbd", "code", "samp", "img", "map", "area",
    "pre", "sub", "sup", "ul", "ol", "li", "dl", "dt", "dd", "table", "caption", "thead",
    "tfoot", "tbody", "colgroup", "col", "tr", "th", "td", "ins", "del", "u", "s", "font",
    "center", "strike", "section", "article", "header", "footer", "figure", "figcaption",
    "mark", "time", "wbr", "nav", "aside", "details", "summary",
})
ALLOWED_ATTRIBUTES = frozenset({
    "title", "style", "class", "id", "lang", "xml:lang", "dir", "accesskey", "tabindex",
    "span", "width", "align", "valign", "char", "charoff", "abbr", "axis", "headers",
    "scope", "rowspan", "colspan", "cellspacing", "cellpadding", "border", "frame",
    "rules", "summary", "height", "href", "name", "src", "alt", "longdesc", "hreflang",
    "type", "rel", "rev", "shape", "coords", "start", "value", "compact", "cite",
    "datetime", "face", "size", "color", "bgcolor", "nowrap", "noshade", "clear",
    "usemap", "ismap", "xmlns", "target", "hspace", "vspace",
})
def narrative_problems(div: str) -> list[str]:
    """What is wrong with the XHTML of a narrative's ``div`` (empty when nothing)."""
    problems: list[str] = []
    depth = 0
    content = False
    parser = expat.ParserCreate(namespace_separator=" ")

    def start(name: str, attributes: dict[str, str]) -> None:
        nonlocal depth, content
        namespace, _, local = name.rpartition(" ")
        if depth == 0:
            if local != "div":
                problems.append(f"the narrative must be a <div>, not <{local}>")
            if namespace != XHTML_NAMESPACE:
                problems.append("the narrative <div> must be in the XHTML namespace "
                                f"(xmlns=\"{XHTML_NAMESPACE}\")")
        elif namespace != XHTML_NAMESPACE:
            problems.append(f"<{local}> is not an XHTML element (namespace "
                            f"{namespace or 'none'})")
        if local not in ALLOWED_ELEMENTS:
            problems.append(f"the element <{local}> is not allowed in a narrative"
                            + (" (scripts are never allowed)" if local == "script" else ""))
        if local == "img":
            content = True
        for attribute, value in attributes.items():
            plain = attribute.rpartition(" ")[2]
            if attribute.startswith("http://www.w3.org/XML/1998/namespace "):
                plain = "xml:" + plain
            if plain not in ALLOWED_ATTRIBUTES:
                problems.append(f"the attribute {plain} is not allowed on <{local}> in a "
                                "narrative")
            elif plain in ("href", "src") and value.strip().lower().startswith(
                    ("javascript:", "vbscript:")):
                problems.append(f"the {plain} of <{local}> may not be a script")
        depth += 1

    def end(_name: str) -> None:
        nonlocal depth
        depth -= 1

    def text(data: str) -> None:
        nonlocal content
        if depth > 0 and data.strip():
            content = True

    def doctype(*_args: object) -> None:
        problems.append("a narrative may not declare a DTD (<!DOCTYPE>)")

    def entity(*_args: object) -> None:
        problems.append("a narrative may not declare entities")

    def processing(target: str, _data: str) -> None:
        problems.append(f"a narrative may not contain processing instructions (<?{target}?>)")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = entity
    parser.ProcessingInstructionHandler = processing
    parser.ExternalEntityRefHandler = lambda *_args: 0  # never fetch: the parse fails
    try:
        parser.Parse(div, True)
    except expat.ExpatError as exc:
        if not problems:
            problems.append(f"the narrative is not well-formed XHTML: "
                            f"{expat.ErrorString(exc.code)} (line {exc.lineno}, "
                            f"column {exc.offset})")
        return problems
    if not content and not problems:
        problems.append("the narrative has no content (txt-2: some non-whitespace text or "
                        "an image is needed)")
    return problems
