"""Training an EAGLE-3 head on the target's own greedy outputs: features, vocabulary, loop, acceptance.

Written here rather than with vllm-project/speculators' trainer: that trainer picks ``cuda`` when torch
reports no accelerator and builds flex-attention block masks for compiled GPU kernels, its data generation
needs a vLLM hidden-states server, and its package hard-requires torchvision/torchaudio, which do not load
beside the CPU torch. The head and checkpoint follow the same format (vLLM's ``llama_eagle3``), so a head
trained there serves here and the other way round.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from pydantic import BaseModel, Field
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from distill.eagle3.head import Eagle3Head, HeadShape
from distill.errors import CheckpointError

log = logging.getLogger(__name__)


class Sequence_(BaseModel):
    """One training sequence: chat prompt ids then the target's greedy completion ids."""

    prompt_ids: list[int]
    output_ids: list[int]


def _completion_counts(rows: Sequence[dict[str, Any]]) -> Counter[int]:
    counts: Counter[int] = Counter()
    for row in rows:
        counts.update(row["output_ids"])
    return counts


def _coverage(counts: Counter[int], vocab: Sequence[int]) -> float:
    return sum(counts[t] for t in set(vocab)) / max(1, sum(counts.values()))


def vocab_coverage(rows: Sequence[dict[str, Any]], vocab: Sequence[int]) -> float:
    """Share of the completions' tokens inside the draft vocabulary ``vocab`` (target ids)."""
    return _coverage(_completion_counts(rows), vocab)


def choose_draft_vocab(
    rows: Sequence[dict[str, Any]],
    size: int,
    target_vocab: int,
    reserved: Sequence[int] = (),
    keep: Sequence[int] = (),
) -> tuple[torch.Tensor, float]:
    """A draft vocabulary of ``size`` tokens (sorted target ids) and the share of completion tokens it covers.

    ``keep`` (a smaller head's vocabulary being grown) comes first, then ``reserved`` (see
    :func:`byte_tokens`; at most an eighth of ``size``, so a tiny vocabulary stays frequency-driven), then
    the most frequent completion tokens.
    """
    counts = _completion_counts(rows)
    chosen = dict.fromkeys([*keep, *list(reserved)[: size // 8]])
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        chosen.setdefault(token)
    # Pad with the lowest unused ids so the head always has exactly `size` rows (vLLM's d2t needs them).
    filler = (i for i in range(target_vocab) if i not in chosen)
    while len(chosen) < size:
        chosen.setdefault(next(filler))
    vocab = sorted(list(chosen)[:size])
    return torch.tensor(vocab, dtype=torch.long), _coverage(counts, vocab)


def byte_tokens(tokenizer: Any) -> list[int]:
    """The tokenizer's one-character tokens: in a byte-level BPE these spell every byte, so emoji and rare
    scripts, which the target emits as runs of byte pieces (a row of rockets is a loop of two of them), can
    be drafted even when no training answer used them."""
    return sorted(i for token, i in tokenizer.get_vocab().items() if len(token) == 1)


class Example(NamedTuple):
    """One stored training sequence.

    ``final`` is the target's last (normed) hidden state per position, from which the target's own
    next-token distribution is recomputed for soft-label training; None in stores written without it.
    """

    ids: torch.Tensor
    features: torch.Tensor
    prompt_len: int
    final: torch.Tensor | None = None


class FeatureStore:
    """Target residual streams at the head's aux layers (plus its last hidden state), cached on disk in
    shards (resumable)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def shard(self, index: int) -> Path:
        return self.directory / f"features-{index:05d}.safetensors"

    def shard_rows(self, index: int) -> int:
        """Sequences in a stored shard (read from its header)."""
        with safe_open(str(self.shard(index)), framework="pt") as handle:
            return int(handle.get_slice("lengths").get_shape()[0])

    def extract(
        self,
        target: Any,
        rows: Sequence[dict[str, Any]],
        aux_layers: list[int],
        *,
        max_len: int,
        shard_rows: int,
        autocast_dtype: torch.dtype | None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Run the target over ``rows`` (prompt + completion, cut at ``max_len``) and store aux features."""
        device = next(target.parameters()).device
        shards = math.ceil(len(rows) / shard_rows)
        for index in range(shards):
            if progress:
                progress(index, shards)
            chunk = rows[index * shard_rows : (index + 1) * shard_rows]
            if self.shard(index).is_file() and self.shard_rows(index) >= len(chunk):
                continue  # a shorter shard is the last one of a smaller run: extract it again
            ids_list, feats_list, finals_list, prompt_lens = [], [], [], []
            for start in range(0, len(chunk), 8):
                batch = chunk[start : start + 8]
                seqs = [(r["prompt_ids"] + r["output_ids"])[:max_len] for r in batch]
                width = max(len(s) for s in seqs)
                ids = torch.zeros(len(seqs), width, dtype=torch.long)
                mask = torch.zeros(len(seqs), width, dtype=torch.long)
                for i, s in enumerate(seqs):
                    ids[i, : len(s)] = torch.tensor(s)
                    mask[i, : len(s)] = 1
                with (
                    torch.no_grad(),
                    torch.autocast(
                        device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None
                    ),
                ):
                    out = target.model(
                        input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True
                    )
                stacked = torch.cat([out.hidden_states[layer] for layer in aux_layers], dim=-1)
                for i, s in enumerate(seqs):
                    ids_list.append(torch.tensor(s, dtype=torch.int32))
                    feats_list.append(stacked[i, : len(s)].to(torch.bfloat16).cpu())
                    finals_list.append(out.last_hidden_state[i, : len(s)].to(torch.bfloat16).cpu())
                    prompt_lens.append(min(len(batch[i]["prompt_ids"]), len(s)))
            lengths = torch.tensor([len(t) for t in ids_list], dtype=torch.int64)
            partial = self.shard(index).with_suffix(".partial")
            save_file(
                {
                    "input_ids": torch.cat(ids_list),
                    "features": torch.cat(feats_list),
                    "final": torch.cat(finals_list),
                    "lengths": lengths,
                    "prompt_lengths": torch.tensor(prompt_lens, dtype=torch.int64),
                },
                str(partial),
            )
            partial.replace(self.shard(index))
        if progress:
            progress(shards, shards)

    def load(self, count: int | None = None) -> list[Example]:
        """The first ``count`` stored sequences (None: all): a store grown by a larger run may hold more."""
        sequences: list[Example] = []
        for path in sorted(self.directory.glob("features-*.safetensors")):
            if count is not None and len(sequences) >= count:
                break
            data = load_file(str(path))
            offsets = [0, *torch.cumsum(data["lengths"], 0).tolist()]
            final = data.get("final")
            for i, prompt_len in enumerate(data["prompt_lengths"].tolist()):
                a, b = offsets[i], offsets[i + 1]
                sequences.append(
                    Example(
                        data["input_ids"][a:b].long(),
                        data["features"][a:b],
                        prompt_len,
                        None if final is None else final[a:b],
                    )
                )
        return sequences[:count]


def init_from_target(head: Eagle3Head, target: Any) -> None:
    """Start the head where the target ends: its final norm and the draft rows of its (tied) LM head, and
    ``fc`` passing the latest aux layer through, so step 1 begins near the target's own prediction."""
    with torch.no_grad():
        head.norm.weight.copy_(target.model.norm.weight.float())
        targets = head.d2t + torch.arange(len(head.d2t))
        head.lm_head.weight.copy_(target.lm_head.weight.float()[targets])
        hidden = head.shape.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, -hidden:] = torch.eye(hidden)


def teacher_head_rows(head: Eagle3Head, target: Any) -> torch.Tensor:
    """The target's LM-head rows of the head's draft vocabulary ([V_draft, H]): soft labels come from it."""
    targets = head.d2t + torch.arange(len(head.d2t), device=head.d2t.device)
    weight = target.get_output_embeddings().weight
    return weight.detach().float()[targets.to(weight.device)].to(head.fc.weight.device)


class Batch(BaseModel):
    model_config = {"arbitrary_types_allowed": True}

    features: torch.Tensor
    input_ids: torch.Tensor
    mask: torch.Tensor
    loss_from: torch.Tensor = Field(
        description="Per row: the prompt length; labels before it are not trained on."
    )
    final: torch.Tensor | None = Field(
        None, description="[B, T, H] target last hidden states, when every row has them (soft labels)."
    )


def make_batch(items: Sequence[tuple[Any, ...]], steps: int) -> Batch:
    examples = [Example(*item) for item in items]
    width = max(len(e.ids) for e in examples)
    feat_dim = examples[0].features.shape[-1]
    features = torch.zeros(len(examples), width, feat_dim, dtype=torch.bfloat16)
    input_ids = torch.zeros(len(examples), width + steps, dtype=torch.long)
    mask = torch.zeros(len(examples), width, dtype=torch.long)
    with_final = all(e.final is not None for e in examples)
    final = (
        torch.zeros(len(examples), width, examples[0].final.shape[-1], dtype=torch.bfloat16)
        if (with_final and examples[0].final is not None)
        else None
    )
    for i, e in enumerate(examples):
        features[i, : len(e.ids)] = e.features
        input_ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
        if final is not None and e.final is not None:
            final[i, : len(e.ids)] = e.final
    loss_from = torch.tensor([e.prompt_len for e in examples])
    return Batch(features=features, input_ids=input_ids, mask=mask, loss_from=loss_from, final=final)


def step_losses(
    head: Eagle3Head,
    embed: torch.nn.Embedding,
    batch: Batch,
    steps: int,
    t2d: torch.Tensor,
    teacher_head: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per draft step: mean loss on completion labels, and (correct, valid) masks for acceptance.

    With ``teacher_head`` (the target's LM-head rows of the draft vocabulary, [V_draft, H]) and stored last
    hidden states, the loss is EAGLE-3's: cross-entropy against the target's own next-token distribution
    over the draft vocabulary (whose argmax is the greedy label), which carries more per token than the
    one-hot label. Without them it is cross-entropy on the greedy token.
    """
    device = head.fc.weight.device
    features = batch.features.to(device).float()
    ids = batch.input_ids.to(device)
    mask = batch.mask.to(device)
    b, t = mask.shape
    with torch.no_grad():
        embeds = embed(ids[:, 1 : t + steps]).float()
        teacher_logprobs = None
        if teacher_head is not None and batch.final is not None:
            teacher_logprobs = torch.log_softmax(batch.final.to(device).float() @ teacher_head.T, dim=-1)
    hidden = head(features, embeds, mask, steps)
    positions = torch.arange(t, device=device).unsqueeze(0).expand(b, t)
    lengths = mask.sum(1, keepdim=True)
    losses, checks = [], []
    for j, step_hidden in enumerate(hidden):
        label_pos = positions + j + 2
        labels = ids.gather(1, label_pos.clamp(max=ids.shape[1] - 1))
        valid = (label_pos < lengths) & (label_pos >= batch.loss_from.to(device).unsqueeze(1))
        draft_labels = t2d[labels]
        trainable = valid & (draft_labels >= 0)
        # The LM head (most of the head's FLOPs) runs only where a completion label exists.
        logits = head.logits(step_hidden[valid]).float()
        if teacher_logprobs is not None:
            # The target's distribution over token t+j+2 is read at position t+j+1.
            rows, cols = valid.nonzero(as_tuple=True)
            soft = teacher_logprobs[rows, cols + j + 1].exp()
            loss = -(soft * torch.log_softmax(logits, dim=-1)).sum(-1)
            losses.append(loss.sum() / valid.sum().clamp(min=1))
        else:
            loss = torch.nn.functional.cross_entropy(
                logits, draft_labels[valid].clamp(min=0), reduction="none"
            )
            losses.append((loss * trainable[valid]).sum() / trainable.sum().clamp(min=1))
        correct = torch.zeros_like(valid)
        correct[valid] = head.draft_to_target(logits.argmax(-1)) == labels[valid]
        checks.append((correct, valid))
    return losses, checks


class AcceptanceEstimate(BaseModel):
    """Greedy acceptance of the head on held-out target completions, as vLLM's verifier would count it."""

    per_position: list[float] = Field(description="P(draft tokens 1..j all accepted), j = 1..k.")
    conditional: list[float] = Field(description="P(token j accepted | tokens 1..j-1 accepted).")
    mean_accepted: float = Field(description="Expected accepted draft tokens per step (sum of per_position).")
    acceptance_rate: float = Field(description="vLLM's acceptance rate: mean_accepted / k.")
    tokens: int


def chain_acceptance(checks: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[int], list[int], int]:
    """Counts of all-correct chains per depth and the number of positions where every depth is valid."""
    valid_all = checks[-1][1]
    for _, valid in checks:
        valid_all = valid_all & valid
    chain = valid_all.clone()
    counts = []
    for correct, _ in checks:
        chain = chain & correct
        counts.append(int(chain.sum()))
    denominators = [int(valid_all.sum())] * len(checks)
    return counts, denominators, int(valid_all.sum())


def estimate_acceptance(
    head: Eagle3Head,
    embed: torch.nn.Embedding,
    sequences: Sequence[Example],
    steps: int,
    autocast_dtype: torch.dtype | None,
) -> AcceptanceEstimate:
    t2d = head.target_to_draft()
    totals = [0] * steps
    positions = 0
    head.eval()
    with torch.no_grad(), _autocast(head, autocast_dtype):
        for start in range(0, len(sequences), 8):
            _, checks = step_losses(head, embed, make_batch(sequences[start : start + 8], steps), steps, t2d)
            counts, _, valid = chain_acceptance(checks)
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
            positions += valid
    head.train()
    per_position = [c / max(1, positions) for c in totals]
    conditional = [per_position[0]] + [
        per_position[i] / per_position[i - 1] if per_position[i - 1] else 0.0 for i in range(1, steps)
    ]
    mean = sum(per_position)
    return AcceptanceEstimate(
        per_position=[round(p, 4) for p in per_position],
        conditional=[round(p, 4) for p in conditional],
        mean_accepted=round(mean, 4),
        acceptance_rate=round(mean / steps, 4),
        tokens=positions,
    )


def _autocast(head: Eagle3Head, dtype: torch.dtype | None) -> torch.autocast:
    device = head.fc.weight.device.type
    return torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None)


class TrainState(BaseModel):
    step: int = 0
    epoch: int = 0
    cursor: int = 0
    train_seconds: float = 0.0
    history: list[dict[str, float]] = Field(default_factory=list)


def token_batches(sequences: Sequence[Example], tokens_per_batch: int, seed: int) -> list[list[int]]:
    """Index batches of similar-length sequences up to ``tokens_per_batch`` padded tokens, seeded order."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = len(sequences[i][0])
        if current and width * (len(current) + 1) > tokens_per_batch:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


class HeadTrainer:
    """The training loop: AdamW, warmup + cosine decay, step-weighted losses, checkpoints that resume."""

    def __init__(
        self,
        head: Eagle3Head,
        embed: torch.nn.Embedding,
        sequences: Sequence[Example],
        *,
        steps_ahead: int,
        epochs: int,
        tokens_per_batch: int,
        learning_rate: float,
        warmup_steps: int,
        step_weight_decay: float,
        seed: int,
        autocast_dtype: torch.dtype | None,
        teacher_head: torch.Tensor | None = None,
    ) -> None:
        self.head, self.embed, self.sequences = head, embed, sequences
        self.teacher_head = teacher_head
        self.steps_ahead, self.epochs, self.seed = steps_ahead, epochs, seed
        self.autocast_dtype = autocast_dtype
        self.tokens_per_batch = tokens_per_batch
        self.t2d = head.target_to_draft()
        self.state = TrainState()
        self.per_epoch = len(token_batches(sequences, tokens_per_batch, seed))
        self.total_steps = self.per_epoch * epochs
        self.optimizer = torch.optim.AdamW(
            [p for n, p in head.named_parameters() if p.requires_grad], lr=learning_rate, weight_decay=0.0
        )
        self.base_lr, self.warmup = learning_rate, warmup_steps
        self.weights = [step_weight_decay**j for j in range(steps_ahead)]

    def _lr(self, step: int) -> float:
        if step < self.warmup:
            return self.base_lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.total_steps - self.warmup)
        return self.base_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def train_step(self) -> dict[str, float]:
        batches = token_batches(self.sequences, self.tokens_per_batch, self.seed + self.state.epoch)
        indices = batches[self.state.cursor]
        batch = make_batch([self.sequences[i] for i in indices], self.steps_ahead)
        started = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr(self.state.step)
        with _autocast(self.head, self.autocast_dtype):
            losses, checks = step_losses(
                self.head, self.embed, batch, self.steps_ahead, self.t2d, self.teacher_head
            )
        loss = torch.stack([w * part for w, part in zip(self.weights, losses, strict=True)]).sum() / sum(
            self.weights
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.optimizer.step()
        self.state.train_seconds += time.perf_counter() - started
        self.state.step += 1
        self.state.cursor += 1
        if self.state.cursor >= len(batches):
            self.state.cursor, self.state.epoch = 0, self.state.epoch + 1
        accuracy = [
            float((correct & valid).sum()) / max(1.0, float(valid.sum())) for correct, valid in checks
        ]
        record = {"step": float(self.state.step), "loss": float(loss.detach()), "acc_1": accuracy[0]}
        self.state.history.append(record)
        return record

    @property
    def done(self) -> bool:
        return self.state.step >= self.total_steps

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / "checkpoint.partial"
        torch.save(
            {
                "head": self.head.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "state": self.state.model_dump(),
            },
            partial,
        )
        partial.replace(directory / "checkpoint.pt")

    def load(self, directory: Path) -> bool:
        path = directory / "checkpoint.pt"
        if not path.is_file():
            return False
        try:
            saved = torch.load(path, map_location="cpu", weights_only=False)
            self.head.load_state_dict(saved["head"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.state = TrainState.model_validate(saved["state"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{path}: cannot resume this head checkpoint: {exc}") from exc
        return True


def new_head(
    target_config: Any, draft_vocab: torch.Tensor, aux_layers: list[int] | None, num_layers: int = 1
) -> Eagle3Head:
    head = Eagle3Head(HeadShape.from_target(target_config, len(draft_vocab), aux_layers, num_layers))
    head.set_vocab(draft_vocab)
    return head
