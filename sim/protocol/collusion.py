r"""The malicious variant's consistency check against clients that collude with the server.

In the malicious variant a holder releases a share about client x in Unmasking only after t of x's holders
signed the survivor set it was shown (``SecAggClient._on_signatures``), where t is also the number of
shares that reconstruct x's secrets (the threshold ``SecAggConfig.threshold``). Colluders sign whatever
the server asks and hand it their shares, so that check must hold with T_C of x's holders on the server's
side (``privacy.collusion``).

**The split-view attack.** Let x be an honest client with n holders H(x) (itself and its neighbours;
everyone for SecAgg) and t-of-n sharing. At most c = min(T_C, n - 1) of them collude (x itself is honest);
n - c are honest. The server shows a camp H1 of honest holders a survivor set with x in it, so they release
shares of x's self-mask seed b_x, and a disjoint camp H2 a set without x, so they release shares of x's
mask key s_sk_x (x is never in H2: a client refuses a set that leaves itself out). The colluders sign both
sets. Camp i sees |Hi| + c confirmations and goes ahead iff |Hi| + c >= t, and then the server holds
|Hi| + c >= t shares of that camp's secret, enough to reconstruct it: with b_x and s_sk_x it unmasks x's
input from its masked upload. The attack needs |H1|, |H2| >= max(t - c, 0) and |H1| + |H2| <= n - c:

    possible  <=>  2 max(t - c, 0) <= n - c  <=>  2t <= n + c

(for t > c the two are the same inequality; for t <= c both hold, as 2t <= 2c <= n + c). So the check is safe
iff t > (n + c) / 2, i.e. more than half of the honest holders must confirm (t - c > (n - c) / 2); the
smallest safe threshold is floor((n + c) / 2) + 1.

Special cases: T_C = 0 gives t > n/2 (Dordis footnote 3, the ``threshold >= 0.5`` rule). Bonawitz et al.
(CCS'17) take t > 2n/3 with fewer than n/3 corrupt clients: with c < n/3, (n + c)/2 < 2n/3, so their
choice is safe by this bound, and at c = n/3 the bound is exactly t > 2n/3. For SecAgg+ (Bell et al.
CCS'20) the rule applies per neighbourhood: n is the client's holders, and the T_C colluders may all be
among them.
"""

from __future__ import annotations

import math


def colluding_holders(holders: int, collusion: int) -> int:
    """c: the colluders that can be among the ``holders`` of an honest client's secrets (not the client)."""
    return max(0, min(collusion, holders - 1))


def split_view_possible(threshold: int, holders: int, collusion: int) -> bool:
    """Whether a server with ``collusion`` colluders can split the honest holders into two camps that each
    confirm their own survivor set (``2t <= n + c``, see the module docstring)."""
    return 2 * threshold <= holders + colluding_holders(holders, collusion)


def smallest_safe_threshold(holders: int, collusion: int) -> int:
    """The smallest t of ``holders`` that no split view reaches: ``floor((n + c) / 2) + 1`` (at most n)."""
    return (holders + colluding_holders(holders, collusion)) // 2 + 1


def largest_safe_collusion(threshold: int, holders: int) -> int | None:
    """The most colluders a t-of-``holders`` check withstands (None: any number; -1: not even none)."""
    if threshold >= holders:
        return None  # every holder must confirm, and the victim never confirms a set without itself
    return 2 * threshold - holders - 1


def smallest_safe_fraction(holders: int, collusion: int) -> float:
    """The smallest ``aggregation.threshold`` with three decimals (more where needed to stay below 1) that
    gives ``holders`` holders a safe t, as ``share_threshold`` counts it in floating point: ``floor(fraction
    n) + 1`` (0.58 * 50 is 28.999999999999996, so for t = 30 of 50 this says 0.581, not 0.58)."""
    below = smallest_safe_threshold(holders, collusion) - 1  # floor(fraction n) must reach this
    scale = 1000
    while True:
        units = -(-below * scale // holders)  # below / holders rounded up, in units of 1 / scale
        while units < scale and math.floor(units / scale * holders) < below:
            units += 1
        if units < scale:
            return units / scale
        scale *= 10  # (n - 1) / n rounds up to 1 at this precision
