"""The three Worker-level declarations of the paper (section 5.2).

They only annotate the function (``fn.__rollart_dispatch__``); the :class:`Cluster` reads
the annotation when it binds the method onto itself, and ``check_worker_class`` checks
them against the pools when a config is validated, before any worker starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlparse

from rollart_sdk.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

Mode = Literal["execute_all", "rank0", "one", "dp_split", "tag"]
MODES: tuple[str, ...] = ("execute_all", "rank0", "one", "dp_split")
ATTR = "__rollart_dispatch__"


@dataclass(frozen=True)
class DispatchSpec:
    """How a Cluster dispatches one Worker method.

    - ``execute_all``: broadcast the call to every worker, gather results in rank order.
    - ``rank0``: only the rank-0 worker (e.g. saving a checkpoint once).
    - ``one``: one worker, round robin (stateless work such as scoring).
    - ``dp_split``: the first argument (a list) is cut into one contiguous shard per
      data-parallel rank; other arguments are broadcast; results gathered in rank order
      (``collect="concat"`` flattens list results back into one list).
    - ``tag``: ``hw_mapping``; routed by the call's ``tag_name`` to workers on the mapped
      hardware, round robin among them.
    """

    mode: str
    collect: str = "list"
    hw_affinity: Mapping[str, str] = field(default_factory=dict)
    tag_arg: str = "tag_name"
    serverless_attribute: str | None = None
    serverless_url: str | None = None
    serverless_timeout_s: float = 60.0


def dp_shards(data: Sequence[T], n: int) -> list[list[T]]:
    """The one sharding rule for ``dp_split``: ``n`` contiguous shards in rank order, the
    first ``len(data) % n`` one item longer. Used by ``Cluster`` and by the pipeline when
    it sends a batch to the trainer ranks."""
    size, extra = divmod(len(data), n)
    shards, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        shards.append(list(data[start:end]))
        start = end
    return shards


def _mark(fn: F, spec: DispatchSpec) -> F:
    existing = getattr(fn, ATTR, None)
    if existing is not None:
        raise TypeError(
            f"{fn.__qualname__} already carries @{existing.mode}; a method takes one of "
            "@register, @hw_mapping or @register_serverless"
        )
    setattr(fn, ATTR, spec)
    return fn


def register(mode: str = "execute_all", collect: str = "list") -> Callable[[F], F]:
    """Expose a Worker method on its Cluster with a dispatch ``mode`` (see DispatchSpec)."""
    if mode not in MODES:
        raise ValueError(f"unknown dispatch mode {mode!r}; modes: {', '.join(MODES)}")
    if collect not in ("list", "concat"):
        raise ValueError(f"collect must be 'list' or 'concat', got {collect!r}")
    return lambda fn: _mark(fn, DispatchSpec(mode=mode, collect=collect))


def hw_mapping(hw_affinity: Mapping[str, str], tag_arg: str = "tag_name") -> Callable[[F], F]:
    """Route calls by task tag to workers on the mapped hardware.

    ``hw_affinity`` maps a tag (``"FrozenLake"``) to a hardware class or pool name
    (``"H800"``); ``"default"`` covers every other tag. The call passes the tag as
    ``tag_name`` (keyword or positional). An empty mapping means the table is supplied
    where the Cluster is built (``Cluster(hw_affinity=plan.hw_affinity())``: the config's
    task affinities); without one, every worker serves every tag.
    """
    if not isinstance(hw_affinity, Mapping):
        raise ValueError("hw_mapping needs a {tag: hardware} mapping")
    return lambda fn: _mark(fn, DispatchSpec(mode="tag", hw_affinity=dict(hw_affinity), tag_arg=tag_arg))


def register_serverless(
    attribute: str,
    serverless_url: str | None = None,
    mode: str = "one",
    timeout_s: float = 60.0,
) -> Callable[[F], F]:
    """Make ``self.<attribute>`` a callable that runs a pure function on a serverless
    endpoint (``http(s)://``, ``fc://`` or a plugin's scheme); the method itself is exposed
    on the Cluster with ``mode``. ``serverless_url=None`` uses the URL of the serverless
    pool the worker is bound to (or of the only serverless pool)."""
    if mode not in MODES:
        raise ValueError(f"unknown dispatch mode {mode!r}; modes: {', '.join(MODES)}")
    if not attribute.isidentifier():
        raise ValueError(f"attribute must be a Python identifier, got {attribute!r}")
    return lambda fn: _mark(
        fn,
        DispatchSpec(mode=mode, serverless_attribute=attribute, serverless_url=serverless_url,
                     serverless_timeout_s=timeout_s),
    )


def dispatch_specs(worker_cls: type) -> dict[str, DispatchSpec]:
    """Decorated methods of a Worker class (inherited ones included), by name."""
    out: dict[str, DispatchSpec] = {}
    for klass in reversed(worker_cls.__mro__):
        for name, value in vars(klass).items():
            spec = getattr(value, ATTR, None)
            if isinstance(spec, DispatchSpec):
                out[name] = spec
            elif name in out:
                del out[name]  # overridden without the decorator
    return out


def known_schemes() -> set[str]:
    """Every URL scheme an installed plugin registers a serverless caller for."""
    from rollart_sdk.plugins import get_registry

    return set(get_registry().names("serverless_scheme"))


def check_worker_class(worker_cls: type, pools: Iterable[Any], where: str | None = None) -> None:
    """Reject decorator misuse against the pools (raises ConfigError listing every problem).

    - ``hw_mapping`` naming a hardware class (or pool) that no pool provides;
    - ``register_serverless`` with a URL whose scheme has no caller, or with no URL and
      no serverless pool to take it from.
    """
    pools = list(pools)
    provided = {p.hardware for p in pools} | {p.name for p in pools}
    schemes = known_schemes()
    at = where or worker_cls.__qualname__
    problems: list[tuple[str, str]] = []
    for name, spec in dispatch_specs(worker_cls).items():
        if spec.mode == "tag":
            for tag, hw in spec.hw_affinity.items():
                if hw not in provided:
                    problems.append(
                        (f"{at}.{name} @hw_mapping[{tag!r}]", f"hardware {hw!r} is provided by no "
                         f"pool; pools provide: {', '.join(sorted(provided))} (add a pool with "
                         f"hardware: {hw}, or map the tag to one of these)")
                    )
        if spec.serverless_attribute:
            url = spec.serverless_url
            if url is None:
                if not any(p.kind == "serverless" for p in pools):
                    problems.append(
                        (f"{at}.{name} @register_serverless", "no serverless_url given and no "
                         "serverless pool declared (add a pool with kind: serverless and url:)")
                    )
                continue
            scheme = urlparse(url).scheme
            if scheme not in schemes:
                problems.append(
                    (f"{at}.{name} @register_serverless", f"no serverless caller for scheme {scheme!r} "
                     f"in {url!r}; known schemes: {', '.join(sorted(schemes))} (a plugin adds "
                     "one with the hook rollart_register_serverless_schemes)")
                )
    if problems:
        raise ConfigError(problems)
