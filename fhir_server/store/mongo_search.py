"""Running search plans on MongoDB: pages, ``_sort``, keyset cursors, ``_total``, includes.

A plan's filter comes from :mod:`fhir_server.store.mongo_query`. Without ``_sort``
results are in ``rid`` order (first-write order, an ObjectId) and a page is one ``find``
on the ``(type, rid)`` index. With ``_sort`` the page is an aggregation: the sort keys of
each match are taken from its ``sort`` field (written with the resource: per parameter
the lowest value an ascending sort uses and the highest a descending one uses), a missing
value sorts last as it does in the SQLite adapter, and ``rid`` breaks ties::

    [{"$match": <filter>},
     {"$addFields": {"m0": <1 when missing>, "k0": "$sort.birthdate.a", ...}},
     {"$match": <after the cursor>},
     {"$sort": {"m0": 1, "k0": 1, ..., "rid": 1}}, {"$skip": offset}, {"$limit": n + 1}]

Pages are *keyset* pages: the cursor holds the sort tuple of the row a page ends at, so
a page link stays valid while data changes, and new or deleted resources neither repeat
nor skip others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fhir_server.search.plan import Cursor, Include, SearchPlan, SortKey
from fhir_server.store import includes as includes_module
from fhir_server.store.mongo_layout import cursor_value, from_cursor_value
from fhir_server.store.mongo_query import MAX_INNER, Filter, QueryCompiler
from fhir_server.store.port import InvalidSearch, SearchPage, StoredResource

ESTIMATE_CAP = 2000  # a total counted when not asked for, if at most this many match
RESOURCE_FIELDS = {"type": 1, "id": 1, "version": 1, "lastUpdated": 1, "deleted": 1,
                   "body": 1, "method": 1, "rid": 1}


def stored(doc: dict[str, Any]) -> StoredResource:
    return StoredResource(doc["type"], doc["id"], doc["version"], doc["lastUpdated"],
                          bool(doc["deleted"]), doc.get("body", "").encode(),
                          doc.get("method", "PUT"))


def _sort_expression(key: SortKey) -> Any:
    if key.type == "id":
        return "$id"
    if key.type == "lastUpdated":
        return "$lastUpdated"
    end = "d" if key.descending else "a"
    fields = [f"$sort.{param}.{end}" for param in key.index_params]
    if len(fields) == 1:
        return fields[0]
    return {"$max" if key.descending else "$min": fields}


def sort_stages(sort: Sequence[SortKey]) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    """The ``$addFields`` computing a plan's sort keys, and the sort terms (name,
    descending): per key whether it is missing (missing last) and its value, then rid."""
    fields: dict[str, Any] = {}
    terms: list[tuple[str, bool]] = []
    for i, key in enumerate(sort):
        value = {"$ifNull": [_sort_expression(key), None]}
        fields[f"k{i}"] = value
        fields[f"m{i}"] = {"$cond": [{"$gt": [value, None]}, 0, 1]}
        terms += [(f"m{i}", False), (f"k{i}", key.descending)]
    terms.append(("rid", sort[0].descending))
    return fields, terms


def after(terms: Sequence[tuple[str, bool]], values: Sequence[Any], backwards: bool
          ) -> Filter:
    """Strictly after ``values`` in the lexicographic order of ``terms``. A missing sort
    value (null) has nothing after it among the rows that share it, so its alternative
    is left out."""
    alternatives: list[Filter] = []
    for i, (name, descending) in enumerate(terms):
        if values[i] is None:
            continue
        op = "$gt" if descending == backwards else "$lt"
        alternative: Filter = {terms[j][0]: values[j] for j in range(i)}
        alternative[name] = {op: values[i]}
        alternatives.append(alternative)
    if not alternatives:
        return {"_id": {"$in": []}}
    return alternatives[0] if len(alternatives) == 1 else {"$or": alternatives}


def _cursor_key(plan: SearchPlan, length: int) -> list[Any]:
    assert plan.cursor is not None
    if len(plan.cursor.key) != length:
        raise InvalidSearch("_cursor does not belong to this _sort")
    try:
        return [from_cursor_value(v) for v in plan.cursor.key]
    except ValueError:
        raise InvalidSearch("_cursor is not a cursor this server issued") from None


class MongoSearch:
    """Runs plans against the ``resources`` collection (within ``session`` when given:
    the conditions a commit re-checks see the commit's own writes)."""

    def __init__(self, resources: Any):
        self.resources = resources

    def compiler(self, plan: SearchPlan, session: Any = None) -> QueryCompiler:
        async def inner(found: Filter, projection: Filter) -> list[dict[str, Any]]:
            cursor = self.resources.find(found, projection, limit=MAX_INNER + 1,
                                         session=session)
            return list(await cursor.to_list(None))
        return QueryCompiler(inner, plan.access, plan.all_types)

    async def plan_filter(self, plan: SearchPlan, session: Any = None) -> Filter:
        return await self.compiler(plan, session).plan_filter(plan)

    async def count(self, found: Filter, limit: int | None = None, session: Any = None
                    ) -> int:
        if limit is not None:
            return int(await self.resources.count_documents(found, limit=limit,
                                                            session=session))
        return int(await self.resources.count_documents(found, session=session))

    # -- entry points ----------------------------------------------------------------------
    async def search(self, plan: SearchPlan) -> tuple[SearchPage, list[str]]:
        """One page of matches, with the keys (``_id``) of its resources."""
        found = await self.plan_filter(plan)
        if plan.count == 0 or plan.summary == "count":
            return SearchPage([], total=await self.count(found)), []
        if plan.sort:
            rows, more = await self._sorted_rows(plan, found)
        else:
            rows, more = await self._rid_rows(plan, found)
        page = self._page(plan, rows, more)
        page.total = await self._total(plan, found, page)
        return page, [doc["_id"] for _key, doc in rows]

    async def match_ids(self, plan: SearchPlan, limit: int, session: Any = None) -> list[str]:
        found = await self.plan_filter(plan, session)
        cursor = self.resources.find(found, {"id": 1}, sort=[("id", 1)], limit=limit,
                                     session=session)
        return [doc["id"] for doc in await cursor.to_list(None)]

    # -- pages ------------------------------------------------------------------------------
    async def _rid_rows(self, plan: SearchPlan, found: Filter
                        ) -> tuple[list[tuple[tuple[Any, ...], dict[str, Any]]], bool]:
        backwards = plan.cursor is not None and plan.cursor.backwards
        if plan.cursor is not None:
            (rid,) = _cursor_key(plan, 1)
            found = {"$and": [found, {"rid": {"$lt" if backwards else "$gt": rid}}]}
        cursor = self.resources.find(found, RESOURCE_FIELDS,
                                     sort=[("rid", -1 if backwards else 1)],
                                     skip=plan.offset, limit=plan.count + 1)
        docs = await cursor.to_list(None)
        more = len(docs) > plan.count
        docs = docs[:plan.count]
        if backwards:
            docs.reverse()
        return [((cursor_value(d["rid"]),), d) for d in docs], more

    async def _sorted_rows(self, plan: SearchPlan, found: Filter
                           ) -> tuple[list[tuple[tuple[Any, ...], dict[str, Any]]], bool]:
        fields, terms = sort_stages(plan.sort)
        backwards = plan.cursor is not None and plan.cursor.backwards
        pipeline: list[dict[str, Any]] = [{"$match": found}, {"$addFields": fields}]
        if plan.cursor is not None:
            pipeline.append({"$match": after(terms, _cursor_key(plan, len(terms)), backwards)})
        pipeline.append({"$sort": {name: -1 if descending != backwards else 1
                                   for name, descending in terms}})
        if plan.offset:
            pipeline.append({"$skip": plan.offset})
        pipeline += [{"$limit": plan.count + 1},
                     {"$project": {**RESOURCE_FIELDS, **{name: 1 for name, _ in terms}}}]
        docs = await (await self.resources.aggregate(pipeline, allowDiskUse=True)).to_list(None)
        more = len(docs) > plan.count
        docs = docs[:plan.count]
        if backwards:
            docs.reverse()
        return [(tuple(cursor_value(d.get(name)) for name, _ in terms), d) for d in docs], more

    @staticmethod
    def _page(plan: SearchPlan, rows: list[tuple[tuple[Any, ...], dict[str, Any]]],
              more: bool) -> SearchPage:
        page = SearchPage([stored(doc) for _key, doc in rows])
        backwards = plan.cursor is not None and plan.cursor.backwards
        if rows:
            last, first = rows[-1][0], rows[0][0]
            # Paging backwards we came from the page after this one, so it has a next;
            # paging forwards from a cursor, there is a page before.
            if backwards or more:
                page.next = Cursor(last)
            if (backwards and more) or (plan.cursor is not None and not backwards):
                page.previous = Cursor(first, backwards=True)
        return page

    async def _total(self, plan: SearchPlan, found: Filter, page: SearchPage) -> int | None:
        if plan.total == "none":
            return None
        if plan.total in ("accurate", "estimate"):
            return await self.count(found)
        if plan.cursor is None and page.next is None:
            return len(page.resources)  # the whole result is on this page
        counted = await self.count(found, limit=ESTIMATE_CAP + 1)
        return counted if counted <= ESTIMATE_CAP else None  # cheap only when small


class MongoIncludes:
    """The primitives of :mod:`fhir_server.store.includes` on this adapter: resource
    ``_id``\\ s (``"<type>/<id>"``) as keys, every query through the plan's access filter."""

    def __init__(self, resources: Any):
        self.resources = resources

    @staticmethod
    def _allowed(plan: SearchPlan) -> Filter:
        compiler = QueryCompiler(_no_inner, plan.access)
        return compiler.allowed(None) or {}

    async def _live(self, plan: SearchPlan, keys: Sequence[str]) -> list[str]:
        if not keys:
            return []
        found = {"$and": [{**by_keys(keys), "deleted": False}, self._allowed(plan)]}
        present = {d["_id"] for d in await self.resources.find(found, {"_id": 1}).to_list(None)}
        return [k for k in keys if k in present]

    async def forward(self, plan: SearchPlan, includes: Sequence[Include],
                      frontier: Sequence[str]) -> list[str]:
        if not includes or not frontier:
            return []
        docs = await self.resources.find(by_keys(frontier),
                                         {"type": 1, "ix.reference": 1}).to_list(None)
        keys: list[str] = []
        for include in includes:
            params = set(include.stored or (include.param,))
            for doc in docs:
                if doc["type"] != include.source_type:
                    continue
                for row in doc.get("ix", {}).get("reference", ()):
                    target_type, target_id = row.get("target_type"), row.get("target_id")
                    if target_type is None or target_id is None:
                        continue
                    if include.param != "*" and row.get("param") not in params:
                        continue
                    if include.target_type and target_type != include.target_type:
                        continue
                    keys.append(f"{target_type}/{target_id}")
        keys = list(dict.fromkeys(keys))[:includes_module.MAX_INCLUDED + 1]
        return await self._live(plan, keys)

    async def reverse(self, plan: SearchPlan, revincludes: Sequence[Include],
                      frontier: Sequence[str]) -> list[str]:
        if not revincludes or not frontier:
            return []
        targets = [key.split("/", 1) for key in frontier]
        keys: list[str] = []
        for include in revincludes:
            wanted = [(kind, rid) for kind, rid in targets
                      if include.target_type in (None, kind)]
            if not wanted:
                continue
            row: Filter = {"target_id": {"$in": [rid for _kind, rid in wanted]},
                           "target_type": {"$in": sorted({kind for kind, _rid in wanted})}}
            if include.param != "*":
                row["param"] = {"$in": list(include.stored or (include.param,))}
            found = {"$and": [{"type": include.source_type, "deleted": False,
                               "ix.reference": {"$elemMatch": row}}, self._allowed(plan)]}
            cursor = self.resources.find(found, {"_id": 1}, sort=[("rid", 1)],
                                         limit=includes_module.MAX_INCLUDED + 1)
            keys += [d["_id"] for d in await cursor.to_list(None)]
        return keys

    async def fetch(self, keys: Sequence[str]) -> list[StoredResource]:
        if not keys:
            return []
        docs = await self.resources.find({**by_keys(keys), "deleted": False},
                                         RESOURCE_FIELDS).to_list(None)
        by_key = {d["_id"]: d for d in docs}
        return [stored(by_key[k]) for k in keys if k in by_key]


def by_keys(keys: Sequence[str]) -> Filter:
    """Resources by ``_id``, their types and ids spelled out too: on a sharded cluster the
    shard key (type, hashed id) routes the query to the shards holding them."""
    pairs = [key.split("/", 1) for key in keys]
    return {"_id": {"$in": list(keys)}, "type": {"$in": sorted({t for t, _ in pairs})},
            "id": {"$in": sorted({i for _, i in pairs})}}


async def _no_inner(found: Filter, projection: Filter) -> list[dict[str, Any]]:
    raise AssertionError("an access filter has no inner search")


__all__ = ["MongoIncludes", "MongoSearch", "after", "sort_stages", "stored"]

