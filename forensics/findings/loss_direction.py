"""Which way a rank's lost data travelled: its transmit side or its receive side (one-way loss:
a NIC's TX or RX, one direction of a cable or switch port), for :mod:`.network`'s
``network_loss`` finding, which states it with its chain of evidence (issue 44: loss with
``--direction``)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class Direction:
    """Which way a blamed rank's lost data travelled (:func:`loss_direction`)."""
    direction: str | None       # egress (what the rank sent was lost) | ingress (what it received) | both | None
    sent: int                   # data-loss events of segments the rank sent
    received: int               # ... of segments sent to it

    @property
    def one_way(self) -> bool:
        return self.direction in ("egress", "ingress")

    @property
    def text(self) -> str:
        if self.direction == "egress":
            return (f"one way: {self.sent} of {self.sent + self.received} resent or lost segments are ones the rank "
                    "sent (its transmit side: its NIC's TX, the cable or switch port towards the switch)")
        if self.direction == "ingress":
            return (f"one way: {self.received} of {self.sent + self.received} resent or lost segments are ones sent "
                    "to the rank (its receive side: the switch port towards it, its NIC's RX)")
        return ""

    def chain(self, who: str) -> list[str]:
        side = "sent" if self.direction == "egress" else "received"
        return [f"{self.sent + self.received} segments on {who}'s links were resent or lost inside slow collectives",
                f"{self.sent if side == 'sent' else self.received} of them were ones it {side}: the loss is on "
                f"its {'transmit' if side == 'sent' else 'receive'} direction only ({self.direction})",
                "the collectives holding them were slow against the clean ones: the transport stalled"]


ONE_WAY_SHARE = 0.85     # this share of a rank's lost data in one direction: the loss is one way


def loss_direction(counts: pd.DataFrame, blamed: list[int]) -> Direction:
    """For a single blamed rank: of the data-loss events on its links (``counts``: dedup_counts
    rows), how many are of segments it sent (sender = the rank: lost on its way out) and how
    many of segments sent to it; one direction holding ONE_WAY_SHARE of them names it. Several
    blamed ranks (a link between two): no direction."""
    if len(blamed) != 1 or counts.empty:
        return Direction(None, 0, 0)
    r = blamed[0]
    n = pd.to_numeric(counts["n"], errors="coerce").fillna(0)
    sent = int(n[pd.to_numeric(counts["sender"], errors="coerce") == r].sum())
    received = int(n[pd.to_numeric(counts["receiver"], errors="coerce") == r].sum())
    total = sent + received
    if total == 0:
        return Direction(None, 0, 0)
    way = "egress" if sent >= ONE_WAY_SHARE * total else "ingress" if received >= ONE_WAY_SHARE * total else "both"
    return Direction(way, sent, received)
