"""Launcher tags before a line (forensics/parsers/lines.py): what each says."""
from __future__ import annotations

from forensics.parsers.lines import context, strip_tags


def test_torchx_tags_give_the_local_rank_and_a_rank_tag_stays_a_rank():
    assert context("[trainer3]:").local_rank == 3
    assert context("[trainer0|2]:").local_rank == 2
    assert context("[default5]:").local_rank == 5
    c = context("[rank12]:")
    assert (c.rank, c.local_rank) == (12, None)


def test_a_quoted_error_behind_a_torchx_tag_is_read_without_it():
    assert strip_tags("[trainer0|0]:ncclSocketInit: connecting to address") == \
        ("[trainer0|0]:", "ncclSocketInit: connecting to address")


def test_horovodruns_tag_names_the_rank_and_open_mpis_still_does():
    assert context("[1]<stderr>:").rank == 1
    assert context("[1,3]<stdout>:").rank == 3
    assert strip_tags("[1]<stderr>:RuntimeError: ncclCommInitRank failed") == \
        ("[1]<stderr>:", "RuntimeError: ncclCommInitRank failed")
