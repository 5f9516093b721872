"""PARTIES (Chen et al., ASPLOS'19) over cores and LLC ways: the baseline Hera's resource manager is compared with.

What the authors' released controller (``manager/PARTIES.py``) does, in monitoring windows instead of its 0.1-s
intervals, and without the frequency and memory "wheels" (recserve controls cores and ways only):

- one adjustment at a time, judged over the next ``JUDGE_S`` before the next one is made;
- a model violates its QoS when its tail is over ``VIOLATE`` of its SLA (slack under 5%) in this window and the one
  before.  The worst violator gets one unit of its current resource, a free one or else one from the model with
  the most slack.  If its tail did not fall over the judging windows, its next upsize tries the other resource;
- with no violator, the model with the most slack, under ``SPARE`` of its SLA in both windows and not resting,
  gives one unit back.  If any model loses its slack in most judging windows, the unit is returned, the model
  rests (is not downsized) for ``REST_S``, and its next downsize tries the other resource.
"""

from __future__ import annotations

from dataclasses import dataclass

from recserve.policies.rmu import Controller, Decision, NodeControl

VIOLATE = 0.95  # PARTIES: a slack under 0.05 is a QoS violation
SPARE = 0.8     # PARTIES: a slack over 0.2 may give resources back
JUDGE_S = 0.5   # PARTIES: TOLERANCE 5 intervals of 0.1 s judge each adjustment
REST_S = 10.0   # PARTIES: REST 100 intervals of 0.1 s before a reverted model is downsized again
RESOURCES = ("cores", "ways")


@dataclass
class Adjustment:
    """The adjustment being judged: ``kind`` "up" or "down" of one unit of ``resource`` for ``model``."""

    kind: str
    model: str
    resource: str
    tail_ratio: float  # the model's tail / SLA when the unit moved
    windows_left: int
    score: int = 0     # windows that said it helped, less those that said it did not


class PartiesController(Controller):
    """PARTIES' feedback loop (see the module's docstring) on a ``NodeControl``'s workers and LLC ways."""

    name = "parties"

    def __init__(self, judge_s: float = JUDGE_S, rest_s: float = REST_S) -> None:
        super().__init__()
        self.judge_s, self.rest_s = judge_s, rest_s
        self.grow: dict[str, str] = {}    # the resource each model's next upsize takes
        self.shrink: dict[str, str] = {}  # the resource each model's next downsize gives back
        self.resting: dict[str, float] = {}  # seconds before a model may be downsized again
        self.pending: Adjustment | None = None
        self._ratio: dict[str, float] = {}  # each model's tail / SLA in the last window
        self._now: float | None = None

    def step(self, now_s: float, control: NodeControl) -> None:
        period = 1.0 if self._now is None else max(now_s - self._now, 1e-3)
        self._now = now_s
        ratio = {m: control.window_stats(m).tail_ms / control.sla(m)[0] for m in control.models()}
        before, self._ratio = self._ratio, ratio
        for m in self.resting:
            self.resting[m] = max(0.0, self.resting[m] - period)
        if self.pending is not None and not self._judged(now_s, control, ratio):
            return
        violators = [m for m in ratio if min(ratio[m], before.get(m, ratio[m])) > VIOLATE]  # in both windows
        if violators:
            self._upsize(now_s, control, max(violators, key=lambda m: ratio[m]), ratio, period)
            return
        spare = [m for m in ratio if max(ratio[m], before.get(m, ratio[m])) < SPARE and not self.resting.get(m)]
        if spare:
            self._downsize(now_s, control, min(spare, key=lambda m: ratio[m]), ratio, period)

    # ---- judging the last adjustment ----
    def _judged(self, now_s: float, control: NodeControl, ratio: dict[str, float]) -> bool:
        """Count this window for the adjustment being judged; True once it is judged (and reverted if it hurt)."""
        adj = self.pending
        assert adj is not None
        if adj.kind == "up":
            adj.score += 1 if ratio[adj.model] < adj.tail_ratio else -1
        else:
            adj.score += 1 if all(r <= VIOLATE for r in ratio.values()) else -1
        adj.windows_left -= 1
        if adj.windows_left > 0:
            return False
        self.pending = None
        if adj.score > 0:
            return True
        if adj.kind == "up":  # it did not help: the next upsize tries the other resource
            self.grow[adj.model] = _other(adj.resource)
        else:  # it cost someone its QoS: give the unit back and let the model rest
            if _move(control, adj.resource, adj.model, +1):
                self.log.append(Decision(now_s, adj.model, f"revert -1 {adj.resource}", {"score": adj.score}))
            self.resting[adj.model] = self.rest_s
            self.shrink[adj.model] = _other(adj.resource)
        return True

    # ---- adjusting ----
    def _upsize(self, now_s: float, control: NodeControl, m: str, ratio: dict[str, float], period: float) -> None:
        first = self.grow.setdefault(m, RESOURCES[0])
        for res in (first, _other(first)):
            free = _free(control, res) > 0
            donor = None if free else _donor(control, res, m, ratio)
            if free or donor is not None:
                if donor is not None:
                    _move(control, res, donor, -1)
                _move(control, res, m, +1)
                self.grow[m] = res
                self._started("up", now_s, m, res, ratio, period, {"from": donor})
                return

    def _downsize(self, now_s: float, control: NodeControl, m: str, ratio: dict[str, float], period: float) -> None:
        first = self.shrink.setdefault(m, RESOURCES[0])
        for res in (first, _other(first)):
            if _move(control, res, m, -1):
                self.shrink[m] = res
                self._started("down", now_s, m, res, ratio, period, {})
                return

    def _started(self, kind: str, now_s: float, m: str, res: str, ratio: dict[str, float], period: float,
                 detail: dict) -> None:
        windows = max(1, round(self.judge_s / period))
        self.pending = Adjustment(kind, m, res, ratio[m], windows)
        self.log.append(Decision(now_s, m, f"{'+' if kind == 'up' else '-'}1 {res}", {"slack": ratio[m], **detail}))


def _other(res: str) -> str:
    return RESOURCES[1] if res == RESOURCES[0] else RESOURCES[0]


def _units(control: NodeControl, res: str):
    return ((control.get_workers, control.set_workers, control.total_cores()) if res == "cores"
            else (control.get_ways, control.set_ways, control.total_ways()))


def _free(control: NodeControl, res: str) -> int:
    get, _, total = _units(control, res)
    return total - sum(get(o) for o in control.models())


def _donor(control: NodeControl, res: str, m: str, ratio: dict[str, float]) -> str | None:
    """The model with the most slack that holds more than one unit of ``res`` (PARTIES' victim)."""
    get = _units(control, res)[0]
    donors = [o for o in control.models() if o != m and get(o) > 1]
    return min(donors, key=lambda o: ratio[o]) if donors else None


def _move(control: NodeControl, res: str, m: str, delta: int) -> bool:
    """One unit of ``res`` to (+1, from the free units) or from (-1, never its last) ``m``; False if it cannot."""
    get, put, _ = _units(control, res)
    n = get(m) + delta
    if n < 1 or (delta > 0 and _free(control, res) < delta):
        return False
    put(m, n)
    return True
