"""Groups that share one name: user-named split groups and older torch record several member sets
under one name. PyTorch's analyzer keys each by name and members; so does the job model, and that
key is the group's identity everywhere downstream (verdict, report, trace span ids). The recorded
name stays on the group (``ProcessGroup.recorded_name``) for what the metrics and rules label.
"""

from __future__ import annotations

from functools import partial

from ..common.ranks import compress_ranks
from ..read.dump import Entry, RankDump

__all__ = ["rename_split_group", "split_group_key"]


def split_group_key(name: str, ranks: tuple[int, ...]) -> str:
    """The key of one of several groups recorded under one name: the name with its members,
    ``3[0-1,4]``."""
    return f"{name}[{compress_ranks(ranks)}]"


def rename_split_group(
    name: str, sets: dict[tuple[int, ...], str], dumps: dict[int, RankDump], problems: list[str]
) -> None:
    """Give each rank's records of a shared group name the key of the member set it belongs to."""
    for rank, dump in dumps.items():
        if name not in dump.histories and not any(e.pg_name == name for e in dump.tail):
            continue
        own = dump.pg_config.get(name)
        ranks = own.ranks if own is not None and own.ranks and rank in own.ranks else None
        if ranks is None:
            ranks = next((r for r in sets if rank in r), None)
        if ranks is None:
            problems.append(f"{dump.path}: rank {rank} recorded group {name}, but no member set of that name "
                            "holds it; left unpaired")
            continue
        key = split_group_key(name, ranks)
        if name in dump.histories:
            dump.histories[key] = dump.histories.pop(name)
            dump.histories[key].name = key
        dump.rewrite_entries(partial(_renamed, name, key))


def _renamed(old: str, new: str, entries: list[Entry]) -> list[Entry]:
    return [e._replace(pg_name=new) if e.pg_name == old else e for e in entries]
