"""Several models per cluster: which models live workers serve, and where a job for one goes.

Each worker serves the model it was started with and says so in its heartbeat
(``model_id``, :func:`core.model_source.model_id`); the heartbeat also stamps the id in
``keys.MODELS_SEEN`` (core/workers.py), so the cluster remembers a model whose workers have all gone.

Queues. A job for the web's own model (its ``MINISERVE_MODEL``) goes to the shared queues
``generation`` / ``agent``, exactly as in a single-model cluster; a job for any other model
goes to that model's queues ``generation.<id>`` / ``agent.<id>``. Every worker consumes its
model's queues (added at start, worker/app.py) and its own per-worker queue; the workers of
the web's model also consume the shared queues (their ``-Q``). A job's record keeps the
queue it was sent to, so a re-queued job returns to a queue of its model. A worker that
takes a job for another model (misconfigured ``-Q``) forwards it to that model's queue.

Names. A request's ``model`` is resolved to a model id by :meth:`Served.resolve`, the one
place that does it: the id, an alias (a worker's heartbeat lists its model's aliases,
``model_aliases``: core/model_source.py), either of them with an Ollama-style ``:latest``
tag, all compared without case; ``default`` (unless a model has that alias) and no name at
all mean the cluster's default. Any other name answers with the only model when the cluster
offers one (as llama-server does), and is unknown when it offers several.

Kinds. A model is a chat model or an embedding model (``model_kind`` in each heartbeat,
core.model_source.model_kind). An embedding model's jobs always go to its queue
``embedding.<id>``, consumed only by its workers (they take no shared queue); a request
that names a model of the other kind is refused (400) by the web before anything is queued.

Answers for a resolved id: served by a live worker, or the web's own model that no
worker has served yet (a starting cluster: the job waits) -> its queue; seen before but no
live worker now -> :class:`ModelUnavailable` (503, retry later); never seen, or not seen for
``KNOWN_FOR_S`` -> :class:`UnknownModel` (404 ``model_not_found``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from core import keys
from core.model_source import CHAT
from core.workers import list_workers

KNOWN_FOR_S = 24 * 3600  # a model unseen this long is forgotten: its id becomes unknown (404)
SHARED_QUEUES = {"generation": "generation", "agent": "agent"}  # job kind -> shared queue
EMBEDDING_QUEUE = "embedding"  # base of an embedding model's queue: embedding.<model id>
MODEL_QUEUE_BASES = (*SHARED_QUEUES, EMBEDDING_QUEUE)
DEFAULT_NAME = "default"  # a request's name for the cluster's default model
LATEST_TAG = ":latest"  # Ollama's default tag: ``name:latest`` is ``name``


class UnknownModel(LookupError):
    """No worker of this cluster serves, or recently served, this model."""


class ModelUnavailable(RuntimeError):
    """The model is known, but none of its workers is alive now."""


@dataclass(frozen=True)
class Served:
    """What the web knows about the cluster's models at one moment."""

    own: str  # the web's MINISERVE_MODEL id: its jobs use the shared queues
    live: dict[str, list[str]]  # model id -> names of live workers serving it
    seen: set[str]  # models a worker served within KNOWN_FOR_S
    aliases: dict[str, list[str]] = field(default_factory=dict)  # model id -> its other names
    kinds: dict[str, str] = field(default_factory=dict)  # model id -> "chat" | "embedding" (live workers)
    own_kind: str = CHAT  # the kind of the web's own model

    def kind(self, model: str) -> str:
        """A model's kind, as its live workers say (the web's own model: from its source)."""
        return self.kinds.get(model) or (self.own_kind if model == self.own else CHAT)

    def available(self, kind: str | None = None) -> list[str]:
        """Ids a request may name now: served by a live worker, or the web's own model while
        no worker has served it yet; only models of ``kind`` when given."""
        ids = set(self.live)
        if self.own not in self.seen:
            ids.add(self.own)
        return sorted(model for model in ids if kind is None or self.kind(model) == kind)

    def names(self, model: str) -> list[str]:
        """A model's aliases, as its workers (or the web, for its own model) declare them."""
        return list(self.aliases.get(model, []))

    def resolve(self, requested: str | None, own_is_explicit: bool, kind: str = CHAT) -> str:
        """The id of the model a request's ``model`` names, when a job for it can be queued now.

        ``None``, ``""`` and ``default`` (unless a model has that alias) -> :meth:`default`;
        an id or alias of any model, bare or tagged ``:latest``, case aside -> that model (its
        kind is the caller's to check); any other name -> the only model of ``kind`` on
        offer, else :class:`UnknownModel`. The id found is then checked (:meth:`check`:
        :class:`ModelUnavailable` when its workers are gone)."""
        if not requested:
            return self.check(self.default(own_is_explicit, kind))
        found = self._lookup(requested)
        if found is None and requested.lower() in (DEFAULT_NAME, DEFAULT_NAME + LATEST_TAG):
            found = self.default(own_is_explicit, kind)
        if found is None:
            offered = self.available(kind)
            if len(offered) != 1:
                raise UnknownModel(requested)
            found = offered[0]
        return self.check(found)

    def _lookup(self, requested: str) -> str | None:
        """The model whose id or alias ``requested`` is (``:latest`` dropped), among the models
        live now, the web's own, and (ids only: aliases come with heartbeats) models seen lately."""
        wanted = {requested.lower()}
        if requested.lower().endswith(LATEST_TAG):
            wanted.add(requested.lower().removesuffix(LATEST_TAG))
        candidates = sorted(set(self.live) | {self.own} | self.seen)
        for model in candidates:
            if model.lower() in wanted:
                return model
        for model in candidates:
            if wanted & {name.lower() for name in self.names(model)}:
                return model
        return None

    def default(self, own_is_explicit: bool, kind: str = CHAT) -> str:
        """The model of a request that names none: the web's ``MINISERVE_MODEL`` when set,
        else the only model of ``kind`` served, else the bundled default (the web's own)."""
        live = [model for model in self.live if self.kind(model) == kind]
        if not own_is_explicit and len(live) == 1:
            return live[0]
        return self.own

    def check(self, model: str) -> str:
        """``model`` when a job for it can be queued now; raises otherwise."""
        if model in self.live or (model == self.own and model not in self.seen):
            return model
        if model in self.seen:
            raise ModelUnavailable(model)
        raise UnknownModel(model)

    def queue(self, base: str, model: str) -> str:
        """The queue a job of kind ``base`` (``generation``, ``agent``) for ``model`` is sent to."""
        return base if model == self.own else keys.model_queue(base, model)


def served(client: redis.Redis, own: str, alive_s: float, listed_s: float | None = None,
           now: float | None = None, own_aliases: list[str] | None = None, own_kind: str = CHAT) -> Served:
    """Live workers by model (heartbeats younger than ``alive_s``) and the models seen lately,
    with the aliases and kinds live workers declare (``own_aliases``: the web's own model's).
    ``listed_s`` (default ``alive_s``) is the age beyond which ``list_workers`` prunes index
    entries: pass the web's ``MINISERVE_WORKER_MAX_AGE_S`` so this read prunes no more than
    ``/workers`` does."""
    now = time.time() if now is None else now
    live: dict[str, list[str]] = {}
    aliases: dict[str, list[str]] = {own: list(own_aliases or [])}
    kinds: dict[str, str] = {}
    for worker in list_workers(client, max(alive_s, listed_s or 0.0), now=now):
        info = worker.get("info") or {}
        model = info.get("model_id")
        if worker["age_s"] <= alive_s and isinstance(model, str) and model:
            live.setdefault(model, []).append(worker["name"])
            names = aliases.setdefault(model, [])
            names.extend(n for n in info.get("model_aliases") or [] if isinstance(n, str) and n not in names)
            kinds[model] = str(info.get("model_kind") or CHAT)
    return Served(own, live, seen_models(client, now), aliases, kinds, own_kind)


def seen_models(client: redis.Redis, now: float | None = None) -> set[str]:
    now = time.time() if now is None else now
    return {model for model, at in client.hgetall(keys.MODELS_SEEN).items() if now - float(at) <= KNOWN_FOR_S}


def model_queues(client: redis.Redis) -> list[str]:
    """Every per-model queue of the models seen lately (queue depths, the sweeper's scan)."""
    return [keys.model_queue(base, model) for model in sorted(seen_models(client)) for base in MODEL_QUEUE_BASES]
