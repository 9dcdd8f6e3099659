"""``_include`` and ``_revinclude`` (with ``:iterate``), the same for every adapter.

R4 3.1.1.5.4: a page's matches are followed through the reference parameters that
``_include`` names (the resources they point at) and that ``_revinclude`` names (the
resources pointing at them); with ``:iterate`` what was added is followed again, up to
:data:`MAX_INCLUDE_DEPTH` rounds. Each resource is added once, whatever reaches it, and
never a match of the page again. A page that would add more than :data:`MAX_INCLUDED`
resources is refused with a clear message instead of growing without bound.

The algorithm runs over an adapter's :class:`IncludeSource`: its two primitives answer,
for a frontier of resources, the keys of the resources they reference and of those that
reference them — through the plan's access filter, so nothing the caller may not see is
ever included — and ``fetch`` reads resources by key. Keys are opaque here (SQLite uses
its row ids).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol, TypeVar

from fhir_server.search.plan import Include, SearchPlan
from fhir_server.store.port import InvalidSearch, StoredResource

MAX_INCLUDED = 1000  # included resources per page
MAX_INCLUDE_DEPTH = 3  # rounds of _include:iterate

Key = TypeVar("Key", bound=Hashable)


class IncludeSource(Protocol[Key]):
    async def forward(self, plan: SearchPlan, includes: Sequence[Include],
                      frontier: Sequence[Key]) -> list[Key]:
        """Keys of the resources ``frontier`` references through ``includes``."""
        ...

    async def reverse(self, plan: SearchPlan, revincludes: Sequence[Include],
                      frontier: Sequence[Key]) -> list[Key]:
        """Keys of the resources that reference ``frontier`` through ``revincludes``."""
        ...

    async def fetch(self, keys: Sequence[Key]) -> list[StoredResource]:
        """The current resources of ``keys``, in that order (deleted ones left out)."""
        ...


async def collect_includes(plan: SearchPlan, page: Sequence[Key], source: IncludeSource[Key]
                           ) -> list[StoredResource]:
    """What ``plan``'s ``_include``/``_revinclude`` add to a page of matches ``page``."""
    seen = set(page)
    included: list[StoredResource] = []
    frontier = list(page)
    iterate = any(i.iterate for i in [*plan.includes, *plan.revincludes])
    for depth in range(MAX_INCLUDE_DEPTH):
        includes = [i for i in plan.includes if depth == 0 or i.iterate]
        revincludes = [i for i in plan.revincludes if depth == 0 or i.iterate]
        found = [*(await source.forward(plan, includes, frontier) if includes else []),
                 *(await source.reverse(plan, revincludes, frontier) if revincludes else [])]
        new = [k for k in dict.fromkeys(found) if k not in seen]
        seen.update(new)
        if len(included) + len(new) > MAX_INCLUDED:
            raise InvalidSearch(
                f"_include/_revinclude would add more than {MAX_INCLUDED} resources to this "
                "page; lower _count or narrow the search")
        included += await source.fetch(new)
        if not new or not iterate:
            break
        frontier = new
    return included
