"""Refining gpu_rate's ceiling between its grid points (pure: unit-tested in
tests/bench/test_rate_refine.py).

The grid (streams x tokens/s per stream) is coarse: a path whose highest passing point
is 1,600 tokens/s and whose next point up, 3,200, fails may hold anywhere in between.
After the grid, each path bisects the offered tokens/s between the two: its highest
passing grid point and the lowest failing one above it, for a few steps. The streams
stay fixed (REFINE_STREAMS) and the pace of each stream moves, because:
- the paths are compared at one concurrency, and 64 streams is where the issue's
  misses are (at 16 streams every path passes up to the grid's top pace);
- a stream count between grid points would change the concurrency and the pace's
  allowance for the gap at once (the limit allows the engine's own gap between tokens,
  1 / pace), so two probes would differ in two ways;
- the pace is a file the engine double rereads per request: no reload between probes.

The bisection assumes what the grid shows, that a path passing at some offered load
passes below it at this concurrency; the refined ceiling is the highest offered load
that met every limit, grid point or probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REFINE_STREAMS = 64
REFINE_STEPS = 3  # the interval shrinks 8x: 1,600 .. 3,200 is told to 200 tokens/s
RATE_DECIMALS = 1  # tokens/s per stream, as the double is told it


@dataclass
class Bisection:
    """Probes between `low` (met, or 0: nothing met) and `high` (failed), offered
    tokens/s, at `streams` streams; `best` is the highest offered load that met."""

    low: float
    high: float
    streams: int = REFINE_STREAMS
    steps: int = REFINE_STEPS
    best: float | None = None
    probed: list = field(default_factory=list)  # (offered, met) in the order run

    def next_rate(self) -> float | None:
        """The next probe's tokens/s per stream, or None when the steps are spent or the
        interval is narrower than one rounding step of the pace."""
        if len(self.probed) >= self.steps:
            return None
        rate = round((self.low + self.high) / 2 / self.streams, RATE_DECIMALS)
        offered = rate * self.streams
        if not self.low < offered < self.high:
            return None
        return rate

    def record(self, rate: float, met: bool) -> None:
        offered = rate * self.streams
        self.probed.append((offered, met))
        if met:
            self.low = offered
            self.best = max(self.best or 0.0, offered)
        else:
            self.high = offered


def bracket(points: list[dict], met) -> tuple[float, float] | None:
    """(highest offered load that met, lowest that failed above it) among one path's
    grid points; 0 for the first when none met; None when nothing failed above the
    highest that met (nothing to refine). `met(point)` says whether a point met the
    limits (rate_stats.meets with the point's own engine gap)."""
    passed = [p["offered_tokens_per_s"] for p in points if met(p)]
    low = max(passed) if passed else 0.0
    above = [p["offered_tokens_per_s"] for p in points if not met(p)]
    above = [offered for offered in above if offered > low]
    return (low, min(above)) if above else None


def refined_ceiling(grid_ceiling: float | None, search: Bisection | None) -> float | None:
    """The higher of the grid's ceiling and the best probe that met."""
    found = [v for v in (grid_ceiling, search.best if search else None) if v is not None]
    return max(found) if found else None
