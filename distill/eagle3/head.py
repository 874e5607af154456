"""The EAGLE-3 draft head in torch, for training, and its export in the checkpoint format vLLM's
``llama_eagle3`` loader reads.

The head mirrors vLLM's ``Eagle3LlamaForCausalLM`` exactly (``model_executor/models/llama_eagle3.py``):
``fc`` fuses three target layers' residual streams; the first Llama decoder layer reads
``cat(input_layernorm(embed(next token)), hidden_norm(h))``, any further layers (``num_layers`` > 1) the
residual stream alone; ``norm`` then an ``lm_head`` over a reduced draft vocabulary whose ids map to the
target's through ``d2t`` (``target = draft + d2t[draft]``). Later draft steps feed the last layer's pre-norm
output back as ``h`` (no ``fc``). Embeddings are the target's own
(not stored), as vLLM shares them when the checkpoint has none.

Training unrolls ``steps`` draft steps with EAGLE-3's training-time test: step j's query at base position t
attends to step 1's keys at positions <= t and to steps 2..j's keys of base t only, which is exactly what
vLLM's KV cache holds when it drafts token j.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from pydantic import BaseModel, Field
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class HeadShape(BaseModel):
    """The head's dimensions, copied from the target's config; ``aux_layers`` index vLLM's aux outputs."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    target_vocab_size: int
    draft_vocab_size: int
    aux_layers: list[int] = Field(description="Target residual streams fused by fc: HF hidden_states[i].")
    num_layers: int = Field(1, ge=1, description="Decoder layers of the head (vLLM's num_hidden_layers).")

    @classmethod
    def from_target(
        cls, config: Any, draft_vocab_size: int, aux_layers: list[int] | None = None, num_layers: int = 1
    ) -> HeadShape:
        layers = int(config.num_hidden_layers)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        return cls(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(theta),
            max_position_embeddings=config.max_position_embeddings,
            target_vocab_size=config.vocab_size,
            draft_vocab_size=min(draft_vocab_size, config.vocab_size),
            aux_layers=aux_layers or default_aux_layers(layers),
            num_layers=num_layers,
        )

    def rope_config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
        )


def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's default for Llama targets (an early, a middle and a late layer), made distinct for tiny ones."""
    chosen = sorted({2, num_layers // 2, num_layers - 3})
    if len(chosen) == 3 and chosen[0] >= 1:
        return chosen
    return [num_layers // 4, max(1, num_layers // 2), num_layers]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class _Attention(nn.Module):
    def __init__(self, shape: HeadShape, width: int) -> None:
        super().__init__()
        h, kv = shape.hidden_size, shape.num_key_value_heads * shape.head_dim
        self.q_proj = nn.Linear(width, shape.num_attention_heads * shape.head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv, bias=False)
        self.v_proj = nn.Linear(width, kv, bias=False)
        self.o_proj = nn.Linear(shape.num_attention_heads * shape.head_dim, h, bias=False)


class _MLP(nn.Module):
    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    """A decoder layer. The first one's attention input is 2H wide (embedding + hidden state), a later one's
    H (the residual stream); every layer carries ``hidden_norm``, as vLLM's loader expects."""

    def __init__(self, shape: HeadShape, first: bool = True) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = _Attention(shape, (2 if first else 1) * shape.hidden_size)
        self.post_attention_layernorm = LlamaRMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = _MLP(shape)


class Eagle3Head(nn.Module):
    """EAGLE-3 drafter; parameter names follow the checkpoint format: the first decoder layer is
    ``midlayer.*`` (vLLM maps it to ``layers.0``), further ones ``layers.<i>.*``."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        self.shape = shape
        h = shape.hidden_size
        self.fc = nn.Linear(h * len(shape.aux_layers), h, bias=False)
        self.midlayer = _MidLayer(shape)
        # A ModuleDict keyed "1".."n-1" so the checkpoint names read layers.<i>, as vLLM numbers them.
        self.layers = nn.ModuleDict(
            {str(i): _MidLayer(shape, first=False) for i in range(1, shape.num_layers)}
        )
        self.norm = LlamaRMSNorm(h, shape.rms_norm_eps)
        self.lm_head = nn.Linear(h, shape.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(shape.rope_config())
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(shape.target_vocab_size, dtype=torch.bool))

    def set_vocab(self, draft_to_target: torch.Tensor) -> None:
        """Use ``draft_to_target`` (sorted target ids, one per draft id) as the draft vocabulary."""
        ids = draft_to_target.to(torch.long)
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_to_draft(self) -> torch.Tensor:
        """Target id -> draft id, -1 for tokens outside the draft vocabulary."""
        mapping = torch.full((self.shape.target_vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        targets = self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)
        mapping[targets] = torch.arange(len(targets), device=self.d2t.device)
        return mapping

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def decoder_layers(self) -> list[_MidLayer]:
        return [
            self.midlayer,
            *(cast(_MidLayer, self.layers[str(i)]) for i in range(1, self.shape.num_layers)),
        ]

    def with_layers(self, num_layers: int) -> Eagle3Head:
        """This head grown to ``num_layers`` decoder layers: its own weights kept, each new layer's output
        projections (``o_proj``, ``down_proj``) zero, so the grown head drafts exactly as this one does until
        training moves them (a residual block that starts as the identity)."""
        if num_layers < self.shape.num_layers:
            raise ValueError(f"cannot shrink a {self.shape.num_layers}-layer head to {num_layers} layers")
        grown = Eagle3Head(self.shape.model_copy(update={"num_layers": num_layers}))
        grown.load_state_dict(self.state_dict(), strict=False)
        with torch.no_grad():
            for layer in grown.decoder_layers()[self.shape.num_layers :]:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        return grown.to(self.fc.weight.device)

    def with_vocab(self, draft_to_target: torch.Tensor, target_rows: torch.Tensor) -> Eagle3Head:
        """This head over another draft vocabulary (sorted target ids): rows of tokens it already drafts
        keep their trained weights, new tokens start from ``target_rows`` (the target's LM-head rows of the
        new vocabulary, [V_new, H]), as a fresh head's do."""
        grown = Eagle3Head(self.shape.model_copy(update={"draft_vocab_size": len(draft_to_target)}))
        state = {k: v for k, v in self.state_dict().items() if not k.startswith(("lm_head.", "d2t", "t2d"))}
        grown.load_state_dict(state, strict=False)
        grown.set_vocab(draft_to_target)
        old_rows = self.target_to_draft()[draft_to_target.to(self.d2t.device)]
        with torch.no_grad():
            weight = target_rows.detach().float().clone().to(grown.lm_head.weight.device)
            known = old_rows >= 0
            weight[known.to(weight.device)] = self.lm_head.weight.detach()[old_rows[known]].to(weight)
            grown.lm_head.weight.copy_(weight)
        return grown.to(self.fc.weight.device)

    def _qkv(self, attn: _Attention, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = self.shape
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, s.num_attention_heads, s.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        cos, sin = self.rotary(v, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        groups = s.num_attention_heads // s.num_key_value_heads
        k = _rope(k, cos, sin).repeat_interleave(groups, dim=1)
        return _rope(q, cos, sin), k, v.repeat_interleave(groups, dim=1)

    def forward(
        self,
        features: torch.Tensor,
        input_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        steps: int,
    ) -> list[torch.Tensor]:
        """Draft logits for ``steps`` unrolled steps.

        ``features``: [B, T, n_aux*H] target residual streams at positions 0..T-1; ``input_embeds``:
        [B, T + steps - 1, H] target embeddings of tokens 1..T+steps-1 (the token after each position);
        ``attention_mask``: [B, T] 1 for real positions. Returns per step j the final-normed hidden states
        [B, T, H] whose row t predicts token t + j + 1 through :meth:`logits` (kept apart so training pays
        for the LM head only at positions it learns from).
        """
        b, t, _ = features.shape
        hidden = self.fc(features)
        base = torch.arange(t, device=features.device).unsqueeze(0).expand(b, t)
        causal = torch.ones(t, t, dtype=torch.bool, device=features.device).tril()
        allowed = causal.unsqueeze(0) & attention_mask.bool().unsqueeze(1)  # [B, Tq, Tk]
        layers = self.decoder_layers()
        # Per layer, the keys and values of every step so far (each layer has its own KV cache in vLLM).
        keys: list[list[torch.Tensor]] = [[] for _ in layers]
        values: list[list[torch.Tensor]] = [[] for _ in layers]
        outputs = []
        for step in range(steps):
            positions = base + step
            stream = hidden
            for index, layer in enumerate(layers):
                if index == 0:
                    embeds = layer.input_layernorm(input_embeds[:, step : step + t])
                    x = torch.cat([embeds, layer.hidden_norm(hidden)], dim=-1)
                else:
                    x = layer.input_layernorm(stream)
                q, k, v = self._qkv(layer.self_attn, x, positions)
                keys[index].append(k)
                values[index].append(v)
                context = self._ttt_attention(q, keys[index], values[index], allowed)
                stream = layer.self_attn.o_proj(context) + stream
                stream = layer.mlp(layer.post_attention_layernorm(stream)) + stream
            outputs.append(self.norm(stream))
            hidden = stream  # vLLM feeds the pre-norm output to the next draft step
        return outputs

    def _ttt_attention(
        self,
        q: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        """Step j's attention: causal over step 1's keys, plus steps 2..j's keys at the query's own base
        position (the training-time test of the module docstring). Returns [B, T, heads * head_dim]."""
        b, _, t, _ = q.shape
        scale = self.shape.head_dim**-0.5
        first = torch.einsum("bhqd,bhkd->bhqk", q, keys[0]) * scale
        first = first.masked_fill(~allowed.unsqueeze(1), torch.finfo(first.dtype).min)
        if len(keys) > 1:
            diagonal = torch.stack([(q * kk).sum(-1) * scale for kk in keys[1:]], dim=-1)
            scores = torch.cat([first, diagonal], dim=-1)
        else:
            scores = first
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
        context = torch.einsum("bhqk,bhkd->bhqd", probs[..., :t], values[0])
        for i, vv in enumerate(values[1:]):
            context = context + probs[..., t + i].unsqueeze(-1) * vv
        return context.transpose(1, 2).reshape(b, t, -1)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of :meth:`forward`'s hidden states."""
        return self.lm_head(normed)

    # --- vLLM checkpoint format -------------------------------------------------------------------

    def vllm_config(self, dtype: str) -> dict[str, Any]:
        s = self.shape
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "num_attention_heads": s.num_attention_heads,
            "num_key_value_heads": s.num_key_value_heads,
            "head_dim": s.head_dim,
            "num_hidden_layers": s.num_layers,
            "rms_norm_eps": s.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": s.rope_theta},
            "rope_theta": s.rope_theta,
            "max_position_embeddings": s.max_position_embeddings,
            "hidden_act": "silu",
            "vocab_size": s.target_vocab_size,
            "draft_vocab_size": s.draft_vocab_size,
            "target_hidden_size": s.hidden_size,
            "tie_word_embeddings": False,
            "torch_dtype": dtype,
            "eagle_aux_hidden_state_layer_ids": s.aux_layers,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": s.aux_layers, "use_aux_hidden_state": True},
            "tandem_head_shape": s.model_dump(),
        }

    def save_vllm(self, directory: Path, dtype: torch.dtype = torch.float32) -> Path:
        """Write ``config.json`` + ``model.safetensors`` in the layout vLLM's eagle3 loader reads."""
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {
            name: tensor.detach().to(dtype if tensor.is_floating_point() else tensor.dtype).contiguous()
            for name, tensor in self.state_dict().items()
            if not name.startswith("rotary.")
        }
        save_file(tensors, str(directory / WEIGHTS_NAME))
        dtype_name = str(dtype).removeprefix("torch.")
        (directory / CONFIG_NAME).write_text(json.dumps(self.vllm_config(dtype_name), indent=2))
        return directory

    @classmethod
    def load_vllm(cls, directory: Path) -> Eagle3Head:
        config = json.loads((directory / CONFIG_NAME).read_text())
        head = cls(HeadShape.model_validate(config["tandem_head_shape"]))
        state = {
            k: v.float() if v.is_floating_point() else v
            for k, v in load_file(str(directory / WEIGHTS_NAME)).items()
        }
        head.load_state_dict(state, strict=False)
        return head


def is_eagle3_dir(directory: Path) -> bool:
    """True when ``directory`` holds an EAGLE-3 head checkpoint (by its config's architecture)."""
    config = directory / CONFIG_NAME
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text()).get("architectures") or []
    return any("Eagle3" in arch for arch in architectures)
