"""One request inside the scheduler: its tokens, progress through the KV cache, and its run."""
from __future__ import annotations

from dataclasses import dataclass, field
import torch

from core.prefix_hash import ROOT_HASH
from engine.run import GenerationRun
from engine.sampling import Sampler
from engine.speculative.policy import SpecState
from engine.types import SamplingParams

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class Sequence:
    """``tokens`` is prompt + generated ids; the last one may not have K/V yet.
    ``num_computed`` counts leading tokens whose K/V is in the pool (0 again after a
    preemption: the blocks are freed and the tokens recomputed on readmission, while the
    ``run`` keeps the text already streamed, so nothing is lost or repeated)."""

    seq_id: int
    prompt_ids: list[int]
    run: GenerationRun
    sampling: SamplingParams
    sampler: Sampler
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_tokens: int | None = None   # prefix hit at first admission (usage.cached_tokens)
    status: str = WAITING
    preemptions: int = 0
    error: BaseException | None = None
    spec: SpecState | None = None      # speculative decoding (None: one token per step)
    drafts: list[int] = field(default_factory=list)  # this step's drafts (slots reserved)
    cache_root: int = ROOT_HASH        # its salt's chain root: shares blocks only with the same salt
    priority: int = 1                  # class number: 0 interactive, 1 default, 2 batch (higher yields first)

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    @property
    def num_pending(self) -> int:
        """Tokens still to run through the forward before the next token can be sampled."""
        return len(self.tokens) - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Past the prompt: one new token per step."""
        return len(self.tokens) > len(self.prompt_ids) and self.num_pending == 1

    def next_token(self, logits: torch.Tensor) -> int:
        """Pick the next id with this sequence's own sampler (penalty, seed, top-k/p)."""
        return self.sampler(logits)
