"""``ls URL``: the entries a store has published (its index records), filtered as a tree's are,
each with a status as ``ls`` gives one, and what an interrupted push or delete left."""

from __future__ import annotations

import time

from autotune_cache.humanize import format_size, plural
from autotune_cache.tree.status import EntryStatus
from autotune_cache.tree.store.storehouse import StoreListing

from .output import Output


STORE_HEADERS = ["ID", "MODEL", "GPU", "PARALLEL", "RANKS", "SIZE", "PUSHED", "SHA256", "STATUS"]


def ls_store(out: Output, listing: StoreListing) -> None:
    """``ls URL``: the entries published in a store (from its index records), filtered as the
    tree's are (``--older-than``: by push time), each with a status as ``ls`` gives one."""
    store = listing.store
    for line in store.unreadable:  # one bad record is named, the others list
        out.warn(line)
    now = time.time()
    views = listing.views(now)
    remains = listing.remains()  # counted, never swept: ls only reads

    def human() -> None:
        def parallel(r) -> str:
            t = r.topology or {}
            if not t:
                return "-"
            dp = f" dp{t['dp']}{'a' if t.get('dp_attention') else 'r'}" if t.get("dp", 1) > 1 else ""
            return f"tp{t['tp']}{dp} ep{r.ep if r.ep is not None else '?'}"

        if views:
            out.table(STORE_HEADERS, [[str(v.id), v.model or "-", v.gpu_short, parallel(v.record), str(v.record.rank_files),
                                       v.size_on_disk_str, v.record.pushed or "-", v.record.sha256[:12], v.status.value]
                                      for v in views])
        by_status = ", ".join(f"{n} {s}" for s in EntryStatus.names()
                              if (n := sum(1 for v in views if v.status.value == s)))
        out.line(f"\n{plural(len(views), 'entry', 'entries')} in {store}" + (f" ({by_status})" if by_status else ""))
        if remains.orphans:
            out.line(f"{plural(len(remains.orphans), 'bundle')} no index record names ({format_size(sum(o.size for o in remains.orphans))}, "
                     f"left by an interrupted push or delete): {remains.sweepable(now)} go with the next push, rm or prune")

    out.emit(human=human, ids=[str(v.id) for v in views],
             data=lambda: {"store": str(store), "entries": [{**v.to_dict(), "stale": v.status == EntryStatus.STALE}
                                                            for v in views],
                           "unreadable": list(store.unreadable), "remains": remains.to_dict(now)})


