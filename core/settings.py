"""All configuration, read once from ``MINISERVE_*`` environment variables.

Everything else receives a :class:`Settings` instance; nobody else reads ``os.environ``.
A bad value raises :class:`SettingsError` naming the variable, so start-up stops loudly.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.methods import BATCHED_METHOD, GENERATION_METHODS

PositiveInt = Annotated[int, Field(gt=0)]
DEFAULT_MODEL = "default"


class SettingsError(ValueError):
    """A ``MINISERVE_*`` variable holds a value we cannot use."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """CPU list notation ("0-3,6") -> sorted CPU ids; "" -> () (no pinning)."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise ValueError(f"must be a CPU list such as 0 or 0-3,6, not {text!r}") from None
        if low < 0 or high < low:
            raise ValueError(f"bad CPU range {part!r} in {text!r}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MINISERVE_", extra="ignore", frozen=True)

    # Where things live.
    redis_sentinel_master: str = "mymaster"  # the master's name when redis_url is sentinel://
    # redis://host:6379/0, or sentinel://h1:26379;sentinel://h2:26379 (see core/redis_conn.py)
    redis_url: str = "redis://127.0.0.1:6379/0"
    model: str = DEFAULT_MODEL
    # More names the model answers to in a request's ``model`` (vLLM's --served-model-name).
    model_aliases: Annotated[list[str], NoDecode] = []
    cache_dir: Path = Path.home() / ".cache" / "miniserve"

    # How the model runs.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # auto: the quality-matched low-bit plan on CPU, none on CUDA; gguf: a quantized GGUF run on
    # its own bits from the mapped file (docs/quantization.md).
    quant: Literal["auto", "none", "q8", "gguf"] = "auto"
    # official (transformers' generate) under q8 or packed bf16 reloads the full-precision weights
    # per job and frees them after it (engine.quant.restore); true keeps them after the first.
    official_keep_weights: bool = False
    threads: int = Field(default=0, ge=0)  # 0 = torch's default

    # Web server.
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    # Open connections one web process holds (gevent worker: a connection costs a greenlet,
    # not a thread; an SSE stream also holds one Redis connection while it follows a job).
    web_connections: PositiveInt = 4000
    # The request line and headers must arrive within this many seconds (also the keep-alive
    # idle limit between two requests on one connection).
    header_timeout_s: PositiveInt = 5
    api_keys: Annotated[list[str], NoDecode] = []
    # Keys that also see operators' details on /workers (hosts, pids, paths, other keys' job
    # ids); each is a valid key too. With no api_keys at all, everyone is the admin.
    admin_api_keys: Annotated[list[str], NoDecode] = []
    rate_limit_per_minute: int = Field(default=0, ge=0)  # 0 = unlimited
    max_queue_depth: int = Field(default=1000, ge=0)  # 0 = unbounded
    max_body_bytes: PositiveInt = 1_000_000
    max_file_bytes: PositiveInt = 20_000_000  # a /v1/files upload (batch input), stored in Redis
    # A batch still ``validating`` whose intake (the web process reading its input) has not
    # appended a line for this long lost that process: it is failed, its queued jobs cancelled.
    batch_intake_stale_s: PositiveInt = 120
    # Where the ``celery`` CLI's ``miniserve.batch`` task finds the web's /v1/files and
    # /v1/batches ("": http://127.0.0.1:<port>, the web of ``make run``), and the API key it
    # sends there ("": none; needed when api_keys is set).
    web_url: str = ""
    web_api_key: str = ""
    # Per key, what /v1/files may hold at once (files expire with the job TTL or DELETE).
    max_files_per_key: PositiveInt = 100
    max_file_store_bytes_per_key: PositiveInt = 100_000_000
    body_timeout_s: PositiveInt = 10  # a request body that stops arriving this long is refused (400)
    body_deadline_s: PositiveInt = 30  # a whole body must arrive within this, however it drips (400)
    # Open SSE streams per client, counted across web processes in Redis: per API key, and
    # per address (each its own limit of this size); one more is a 429. 0 = unlimited.
    max_streams_per_client: int = Field(default=100, ge=0)
    web_workers: PositiveInt = 2  # gunicorn processes; each holds web_connections connections
    wait_timeout_s: PositiveInt = 300  # POST /generate and /agent/run wait this long, then 504
    sse_keepalive_s: PositiveInt = 15  # idle SSE streams get a comment line this often
    worker_max_age_s: PositiveInt = 30  # a worker heartbeat older than this is not "seen"

    # Logs.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    json_logs: bool = True

    # Generation limits.
    default_max_new_tokens: PositiveInt = 128
    # The method a job runs with unless its body names one: ``paged`` joins the worker's
    # shared batches (greedy-identical to ``official``; see docs/architecture.md).
    default_generation_method: Literal[GENERATION_METHODS] = BATCHED_METHOD  # type: ignore[valid-type]
    max_new_tokens_cap: PositiveInt = 2048
    max_prompt_chars: PositiveInt = 100_000
    # Text chunks produced within this many ms of the last token event join the next one
    # (core/coalesce.py): fewer stream entries per job. 0 = one event per chunk.
    token_event_interval_ms: int = Field(default=100, ge=0, le=5000)
    # Agent prompts are also capped in characters: the tokenizer packs long runs (1 MB of
    # dashes) into few tokens, and the agent's prompt analysis and retrieval read every char.
    agent_max_prompt_chars: PositiveInt = 32_000

    # Caches.
    prefix_cache_max_entries: PositiveInt = 8
    prefix_cache_max_tokens: PositiveInt = 16_384
    kv_block_size: PositiveInt = 16
    kv_num_blocks: PositiveInt = 1024
    kv_memory_mb: int = Field(default=0, ge=0)  # >0: size the paged pool from this budget
    max_batch: PositiveInt = 8
    max_batched_tokens: PositiveInt = 512
    # Prompt tokens a step may add while sequences are decoding: each step's cost is what every
    # stream waits between two tokens, so a long prompt beside streams goes this slowly (and at
    # max_batched_tokens once nobody streams). Chosen by bench.fairness --long-prompt.
    prefill_tokens_while_decoding: PositiveInt = 1
    # ...besides which prompts whose rest is at most this many tokens are computed whole, up
    # to this many tokens a step: a chat starts answering at once beside streams. 0: none.
    short_prompt_tokens: int = Field(default=64, ge=0)

    # Embedding models (docs/api.md, Embeddings): inputs per forward on an embedding worker
    # (concurrent requests share them), and the most inputs one request may send.
    embedding_max_batch: PositiveInt = 32
    embedding_max_inputs: PositiveInt = 2048

    # Speculative decoding (docs/speculative.md): prompt-lookup drafts, verified in one forward.
    speculative: Literal["off", "ngram"] = "off"
    spec_tokens: int = Field(default=8, ge=1, le=16)  # most drafts per step (k; fewer by expected value)
    spec_ngram: Annotated[tuple[int, ...], NoDecode] = (4, 3, 2)  # suffix lengths tried, longest first

    # Queue and reliability.
    # One worker process, several jobs at once: a threads pool feeding the paged scheduler.
    worker_pool: Literal["threads", "prefork", "solo"] = "threads"
    worker_concurrency: PositiveInt = 8
    # CPUs this worker process (all its threads) may run on, e.g. "0" or "0-3,6"; empty: any.
    # Several workers on one host each pinned to their own cores avoid GIL hand-offs across
    # cores (docs/deployment.md).
    worker_cpus: Annotated[tuple[int, ...], NoDecode] = ()
    soft_time_limit_s: PositiveInt = 600
    hard_time_limit_s: PositiveInt = 660
    lease_s: PositiveInt = 120
    # A worker that has not beaten (every 5 s) for this long is dead: its running jobs are
    # re-queued, and a generation continues where its stream stopped (worker/resume.py).
    worker_dead_s: Annotated[int, Field(ge=10)] = 15
    # A worker's Redis client retries a lost connection this long before a job gives up on
    # its attempt (the job's lease then expires and the reaper re-queues it).
    worker_redis_retry_s: PositiveInt = 60
    max_attempts: PositiveInt = 3
    # Tests only: a worker's engine loop waits, before its first turn, until this many
    # requests are queued for it (at most test_loop_hold_s), so a test sees them start in one
    # step however busy the machine is; more than the worker's concurrency holds its jobs
    # running for that long (a test that kills a worker mid-job). 0 (the default): no hold.
    test_loop_hold: Annotated[int, Field(ge=0)] = 0
    test_loop_hold_s: PositiveInt = 60
    # Tests only: a Redis key; while it exists, the worker's engine loop runs one step per item
    # pushed onto "<key>:steps" (worker/step_gate.py). Empty (the default): no gate.
    test_step_gate: str = ""
    job_ttl_s: PositiveInt = 7 * 24 * 3600

    # Cache-aware routing (docs/deployment.md): a job whose system prompt a worker recently
    # cached goes to that worker's own queue while it is alive and not overloaded.
    route_by_prefix: bool = True
    route_min_prefix_tokens: PositiveInt = 64  # shorter shared prefixes are not worth routing
    route_ttl_s: PositiveInt = 300  # a worker's claim to hold a prefix lasts this long
    route_max_waiting: PositiveInt = 4  # jobs waiting in a worker's own queue before it counts as full
    # Prefix-cache scope: by default each API key's cached prompt blocks serve only that key
    # (its blocks are salted with the key's owner id); true shares them across keys.
    share_prefix_cache_across_keys: bool = False

    # Webhooks (docs/scheduling.md): a job with a ``webhook_url`` gets its record POSTed when it
    # ends, signed as the Standard Webhooks spec says, retried, then dead-lettered.
    webhook_secret: str = ""  # whsec_<base64>: signs webhooks of keys without their own (none: refused)
    webhook_secrets: Annotated[dict[str, str], NoDecode] = {}  # per API key: key=whsec_...,key2=whsec_...
    webhook_urls: Annotated[dict[str, str], NoDecode] = {}  # per API key: its jobs' default webhook_url
    # Hosts (names or IPs) a webhook may target although they are private or loopback.
    webhook_allow_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    webhook_max_tries: PositiveInt = 5  # then the delivery is dead-lettered (GET /webhooks/dead)
    webhook_backoff_s: float = Field(default=10.0, gt=0)  # before the 2nd try; doubling after each failure
    webhook_backoff_max_s: float = Field(default=600.0, gt=0)
    webhook_timeout_s: float = Field(default=10.0, gt=0)  # one try, connect to last byte
    webhook_max_response_bytes: PositiveInt = 65_536  # more of the receiver's answer is not read
    # The fair gate in front of each Celery queue (core/fair_gate.py, docs/scheduling.md): at most
    # this many task messages wait in a queue; later jobs wait in Redis and are released by
    # priority class, then by turns between API keys. 0 turns the gate off (plain FIFO).
    queue_window: int = Field(default=2, ge=0)
    # Worker slots of each queue that batch-class jobs leave free for the other classes (a cap
    # on batch jobs running or waiting in the list: the queue's slots, from heartbeats, less these).
    reserved_slots: int = Field(default=1, ge=0)
    key_priority_caps: Annotated[dict[str, str], NoDecode] = {}  # per API key: the highest class it may ask
    key_max_queued: int = Field(default=0, ge=0)  # per API key: queued jobs at once (more: 429); 0 = no cap
    # Per API key: prompt plus max new tokens of the jobs accepted in the last minute (more: 429
    # with Retry-After; a request bigger than this alone: 400). 0 = no cap.
    key_tokens_per_minute: int = Field(default=0, ge=0)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("device", "dtype", "quant", "worker_pool", "speculative", mode="before")
    @classmethod
    def _lower_choice(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("api_keys", "admin_api_keys", "model_aliases", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @field_validator("webhook_secrets", "webhook_urls", "key_priority_caps", mode="before")
    @classmethod
    def _per_key(cls, value: object) -> object:
        """"key1=value1,key2=value2" (split at each pair's first ``=``) -> a dict."""
        if not isinstance(value, str):
            return value
        pairs = {}
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            key, eq, item = part.partition("=")
            if not eq or not key.strip() or not item.strip():
                raise ValueError(f"must be key=value pairs separated by commas, not {part[:20]!r}...")
            pairs[key.strip()] = item.strip()
        return pairs

    @field_validator("webhook_secret")
    @classmethod
    def _secret_shape(cls, value: str) -> str:
        from core.webhook_sign import secret_bytes

        if value:
            secret_bytes(value)
        return value

    @field_validator("key_priority_caps")
    @classmethod
    def _caps_are_classes(cls, value: dict[str, str]) -> dict[str, str]:
        from core.priorities import PRIORITY_CLASSES

        for key, cap in value.items():
            if cap not in PRIORITY_CLASSES:
                raise ValueError(f"{key[:4]}...={cap}: the class must be one of {', '.join(PRIORITY_CLASSES)}")
        return value

    @field_validator("webhook_secrets")
    @classmethod
    def _secrets_shape(cls, value: dict[str, str]) -> dict[str, str]:
        from core.webhook_sign import secret_bytes

        for secret in value.values():
            secret_bytes(secret)
        return value

    @field_validator("webhook_allow_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(h.strip().lower() for h in value.split(",") if h.strip())
        return value

    @field_validator("spec_ngram", mode="before")
    @classmethod
    def _ngram_lengths(cls, value: object) -> object:
        """"3,2" or "3" -> (3, 2); each length 1..8, longest first, no repeats."""
        if isinstance(value, str):
            try:
                value = [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                raise ValueError("must be comma-separated integers, e.g. 3,2") from None
        if isinstance(value, int):
            value = [value]
        lengths = sorted(set(value), reverse=True) if isinstance(value, (list, tuple)) else value
        if not lengths or any(not isinstance(n, int) or not 1 <= n <= 8 for n in lengths):
            raise ValueError("needs one or more n-gram lengths between 1 and 8")
        return tuple(lengths)

    @field_validator("worker_cpus", mode="before")
    @classmethod
    def _cpu_list(cls, value: object) -> object:
        """"0-3,6" -> (0, 1, 2, 3, 6), the notation of taskset and cpuset."""
        if isinstance(value, str):
            return parse_cpu_list(value)
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str, info) -> str:
        from core.redis_url import parse_redis_url

        parse_redis_url(value, info.data.get("redis_sentinel_master", "mymaster"))
        return value

    @field_validator("hard_time_limit_s")
    @classmethod
    def _hard_above_soft(cls, value: int, info) -> int:
        soft = info.data.get("soft_time_limit_s")
        if soft is not None and value <= soft:
            raise ValueError("must be greater than MINISERVE_SOFT_TIME_LIMIT_S")
        return value

    @property
    def visibility_timeout_s(self) -> int:
        """The broker re-delivers an unacked task after this; it must outlast the hard limit."""
        return self.hard_time_limit_s + 300


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, turning validation errors into one clear message."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            problems.append(f"MINISERVE_{field.upper()}: {error['msg']}")
        raise SettingsError("invalid configuration: " + "; ".join(problems)) from None


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
