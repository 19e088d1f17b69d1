"""The Llama-style decoder's hyper-parameters, with a short string form.

Every trainer in ``integrations`` (torch-native, Megatron style, DeepSpeed) builds
the same logical model from one :class:`LlamaConfig`, so a checkpoint written by
one stack resumes in another.

    >>> cfg = LlamaConfig.parse("layers=2,heads=4,kv_heads=2,num_experts=4")
    >>> cfg.head_dim, cfg.moe
    (8, True)
    >>> LlamaConfig.parse(str(cfg)) == cfg
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ucp.errors import UcpError

__all__ = ["LlamaConfig", "ConfigError"]


class ConfigError(UcpError, ValueError):
    """A model configuration that cannot be built (names the field and the rule)."""


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU, optional MoE.

    ``num_experts > 0`` replaces every MLP by a mixture of ``num_experts`` SwiGLU
    experts with top-``top_k`` routing. ``vocab_multiple`` is Megatron's
    make-vocab-size-divisible-by (the Megatron-style stack pads its embedding
    to a multiple of ``tp * vocab_multiple``; the padding is never saved).
    """

    vocab_size: int = 100
    hidden: int = 32
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 64
    num_experts: int = 0
    top_k: int = 2
    seq_len: int = 16
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.05
    vocab_multiple: int = 8
    seed: int = 1234

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"model config {f.name} must be an integer, got {value!r}")
        positive = ("vocab_size", "hidden", "layers", "heads", "kv_heads", "ffn", "seq_len", "vocab_multiple")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"model config {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ConfigError(f"model config hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ConfigError(f"model config heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"model config head dimension hidden/heads ({self.head_dim}) must be even for RoPE")
        if self.num_experts < 0 or (self.num_experts and not 1 <= self.top_k <= self.num_experts):
            raise ConfigError(
                f"model config top_k ({self.top_k}) must be between 1 and num_experts ({self.num_experts})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LlamaConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown model config field(s) {unknown}; expected some of {sorted(names)}")
        return cls(**data)

    @classmethod
    def parse(cls, text: str) -> "LlamaConfig":
        """``"layers=2,heads=4"`` (omitted fields keep their defaults)."""
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in types:
                raise ConfigError(f"bad model config item {item!r}: expected NAME=VALUE with NAME one of "
                                  f"{sorted(types)}")
            try:
                values[name] = float(value) if types[name] in ("float", float) else int(value)
            except ValueError:
                raise ConfigError(f"bad value {value!r} for model config {name}: expected a number") from None
        return cls(**values)

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if getattr(self, f.name) != f.default)

    def megatron_program(self) -> str:
        """The megatron-gpt UCL preset bound to this model, in its one-string form."""
        return (f"megatron-gpt:num_layers={self.layers},hidden_size={self.hidden},ffn_hidden_size={self.ffn},"
                f"heads={self.heads},kv_heads={self.kv_heads},vocab_size={self.vocab_size},"
                f"vocab_multiple={self.vocab_multiple},num_experts={self.num_experts}")
