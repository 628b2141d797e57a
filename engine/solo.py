"""A non-batched request as a greenlet on the engine loop's thread, resumed one token at a time.

Why greenlets: ``official`` is transformers' ``generate``, a loop we do not own, and the
hand-written methods are plain ``while`` loops that the project keeps readable on purpose
(the comparison between them is what it teaches). Rewriting each as a resumable state
machine would bury that; running each in a thread would put a second thread on engine
state. A greenlet is neither: the method's own code runs unchanged, on the loop thread, and
:meth:`GenerationRun.accept` (the one place every method hands over a token) switches back
to the loop through ``run.pause``. The loop then resumes each solo task once per turn.

What a switch must carry with it: torch's grad/inference modes are thread-local, so the
loop holds ``torch.inference_mode()`` for its whole life and every task sees the same mode.
``official`` samples from torch's *global* generator, so each task keeps its own generator
state and swaps it in while it runs: a seeded job gives the same tokens interleaved as alone,
and the loop's own global state is never advanced by a job.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from greenlet import GreenletExit, greenlet

from engine.run import GenerationRun


def _rng_state() -> list[torch.Tensor]:
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.extend(torch.cuda.get_rng_state_all())
    return states


def _set_rng_state(states: list[torch.Tensor]) -> None:
    torch.set_rng_state(states[0])
    if len(states) > 1:
        torch.cuda.set_rng_state_all(states[1:])


def _fresh_rng_state() -> list[torch.Tensor]:
    """An unseeded job's own generator: a fresh random seed (as a new process would have)."""
    outer = _rng_state()
    torch.seed()
    fresh = _rng_state()
    _set_rng_state(outer)
    return fresh


class SoloTask:
    """One request's method running in its own greenlet; create and resume on the loop thread.

    ``resume()`` runs it up to its next token (or its end) and returns True once it has
    finished; then exactly one of ``result`` / ``error`` is set.
    """

    def __init__(self, fn: Callable[[], Any], run: GenerationRun) -> None:
        self._greenlet = greenlet(fn)  # its parent is the creating (loop) greenlet
        self._rng = _fresh_rng_state()
        self.result: Any = None
        self.error: BaseException | None = None
        run.pause = self._pause

    @property
    def finished(self) -> bool:
        return self._greenlet.dead

    def _pause(self) -> None:
        """Called by ``run.accept`` inside the task: hand the turn back to the loop."""
        self._greenlet.parent.switch()

    def resume(self) -> bool:
        self._switch(self._greenlet.switch)
        return self.finished

    def close(self) -> None:
        """Unwind the task's stack (its ``with``/``finally`` blocks run) without a result."""
        if not self.finished:
            self._switch(lambda: self._greenlet.throw(GreenletExit))

    def _switch(self, into: Callable[[], Any]) -> None:
        outer = _rng_state()
        _set_rng_state(self._rng)
        try:
            value = into()
            if self.finished and not isinstance(value, GreenletExit):
                self.result = value
        except Exception as exc:  # noqa: BLE001 - a failing method fails its own request only
            self.error = exc
        finally:
            self._rng = _rng_state()
            _set_rng_state(outer)
