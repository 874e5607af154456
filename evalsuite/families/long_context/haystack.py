"""Haystacks: seeded filler prose sized in tokens of the served model's tokenizer, with a needle at a depth.

Sizing is fast: a words-per-token ratio is calibrated once per tokenizer, filler is drawn to the estimate,
then the whole prompt is tokenised and trimmed (or topped up) until it fits its budget.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalsuite.schema import DIFFICULTIES, Difficulty

log = logging.getLogger(__name__)

MAX_LENGTH_ENV = "TANDEM_LONG_CONTEXT_MAX_LENGTH"
TOKENIZER_ENV = "TANDEM_LONG_CONTEXT_TOKENIZER"


class LongContextConfig(BaseModel):
    """How long the haystacks are and how their tokens are counted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_length: int = Field(
        default=8192,
        ge=1024,
        description="The served context window in tokens (default: the bundled SmolLM2-135M's 8k). Target "
        f"lengths double from min_length up to it. Environment: {MAX_LENGTH_ENV}.",
    )
    min_length: int = Field(default=1024, ge=256, description="The shortest target length in tokens.")
    reserve_tokens: int = Field(
        default=512,
        ge=0,
        description="Tokens kept free for the answer when a target reaches max_length; at least the eval's "
        "--max-tokens, since a server refuses a prompt plus max_tokens over its window.",
    )
    chat_overhead_tokens: int = Field(
        default=16, ge=0, description="Tokens the chat template adds around the system and user turns."
    )
    depths: tuple[float, ...] = Field(
        default=(0.0, 0.25, 0.5, 0.75, 1.0),
        description="Needle depths as fractions of the haystack (0: first passage, 1: last).",
    )
    tokenizer: str | None = Field(
        default=None,
        description="Hugging Face tokenizer (local dir or name) to count tokens with; None: the bundled "
        f"model's, or an estimate of 4 characters per token when it is not installed. Environment: "
        f"{TOKENIZER_ENV}.",
    )

    @model_validator(mode="after")
    def _check(self) -> LongContextConfig:
        if self.min_length > self.max_length:
            raise ValueError(f"min_length {self.min_length} exceeds max_length {self.max_length}")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"depths must be fractions in [0, 1], got {self.depths}")
        return self

    @classmethod
    def from_env(cls) -> LongContextConfig:
        """Defaults, with ``max_length`` and ``tokenizer`` taken from the environment when set there."""
        values: dict[str, object] = {}
        if os.environ.get(MAX_LENGTH_ENV):
            values["max_length"] = int(os.environ[MAX_LENGTH_ENV])
        if os.environ.get(TOKENIZER_ENV):
            values["tokenizer"] = os.environ[TOKENIZER_ENV]
        return cls.model_validate(values)

    def lengths(self) -> list[int]:
        """Target lengths: min_length doubling up to max_length, with max_length itself last."""
        ladder = [
            self.min_length * 2**i for i in range(int(math.log2(self.max_length / self.min_length)) + 1)
        ]
        return ladder if ladder[-1] == self.max_length else [*ladder, self.max_length]

    def lengths_for(self, difficulty: Difficulty) -> list[int]:
        """The targets of one difficulty: the ladder cut in three, hard being the longest."""
        ladder = self.lengths()
        tiers = [DIFFICULTIES[min(2, i * 3 // len(ladder))] for i in range(len(ladder))]
        chosen = [length for length, tier in zip(ladder, tiers, strict=True) if tier == difficulty]
        return chosen or [ladder[-1] if difficulty == "hard" else ladder[0]]

    def budget(self, target: int) -> int:
        """Most tokens the whole prompt may take for a target length (room for the answer at the window)."""
        return min(target, self.max_length - self.reserve_tokens)


_CONFIG: ContextVar[LongContextConfig | None] = ContextVar("long_context_config", default=None)


def current_config() -> LongContextConfig:
    """The configuration builders use: the one set by :func:`use_config`, else the environment's."""
    return _CONFIG.get() or LongContextConfig.from_env()


@contextlib.contextmanager
def use_config(config: LongContextConfig) -> Iterator[None]:
    """Generate with ``config`` inside the block (builders take only a seed stream and a difficulty)."""
    token = _CONFIG.set(config)
    try:
        yield
    finally:
        _CONFIG.reset(token)


@dataclass(frozen=True)
class TokenCounter:
    """Counts tokens of text the way the served model's tokenizer does (or estimates them)."""

    name: str
    count: Callable[[str], int]
    tokens_per_word: float


_CHARS_PER_TOKEN = 4.0
# A fitted prompt fills at least this share of its budget.
_FILL = 0.98


def token_counter(tokenizer: str | None = None) -> TokenCounter:
    """A counter for ``tokenizer`` (None: the bundled model's), calibrated once; cached per process."""
    return _load_counter(tokenizer)


@functools.lru_cache(maxsize=4)
def _load_counter(tokenizer: str | None) -> TokenCounter:
    count: Callable[[str], int]
    try:
        from transformers import AutoTokenizer

        if tokenizer is None:
            from infra.bundled import BUNDLED_REF, prepare_bundled_model

            source, name = str(prepare_bundled_model()), BUNDLED_REF
        else:
            source, name = tokenizer, tokenizer
        hf_tokenizer = AutoTokenizer.from_pretrained(source)

        def count(text: str) -> int:
            return len(hf_tokenizer(text, add_special_tokens=False)["input_ids"])

    except Exception as exc:  # no transformers, no bundled wheel, unreadable tokenizer
        if tokenizer is not None:
            raise
        log.warning(
            "event=long_context_token_estimate reason=%r chars_per_token=%s", str(exc), _CHARS_PER_TOKEN
        )
        name = f"estimate-{_CHARS_PER_TOKEN:g}-chars"

        def count(text: str) -> int:
            return math.ceil(len(text) / _CHARS_PER_TOKEN)

    sample = " ".join(filler_sentence(random.Random(0)) for _ in range(200))
    return TokenCounter(name=name, count=count, tokens_per_word=count(sample) / len(sample.split()))


_ADJECTIVES = (
    "quiet narrow amber weathered distant restless pale crowded sunlit muddy ancient hollow windy gentle "
    "crooked silver patient stubborn humid frozen"
).split()
_NOUNS = (
    "orchard bridge ferry market meadow quarry chapel granary mill canal harbour pasture valley hedgerow "
    "bakery workshop courtyard terrace marsh forest"
).split()
_CREATURES = "herons sparrows goats foxes otters bees cattle swallows hares crows".split()
_VERBS = "drifted wandered gathered lingered settled scattered returned rested waited clustered".split()
_TIMES = (
    "at dawn", "before the rain", "after the harvest", "late in the evening", "during the thaw",
    "on market day", "in the early autumn", "around midday", "under a low sky", "once the tide turned",
)  # fmt: skip
_TRADES = "carpenters weavers millers fishermen potters masons shepherds coopers".split()
_TEMPLATES = (
    "The {adj} {noun} {verb} into view {time}, as it does most years.",
    "Near the {noun}, {creatures} {verb} {time} while the {trade} worked on.",
    "Local {trade} say the {adj} {noun} was rebuilt twice before anyone wrote it down.",
    "{Time}, the path past the {noun} turned {adj} and few travellers used it.",
    "Nobody remembers why the {noun} beside the {adj} {noun2} was painted green.",
    "The {trade} of the valley kept their tools in the {noun} through the {adj} season.",
    "A {adj} wind crossed the {noun} {time} and the {creatures} {verb} by the wall.",
    "Visitors often mistake the {noun} for the {noun2}, which stands a little further on.",
    "Stories about the {adj} {noun} change with every teller, but the {creatures} appear in all of them.",
    "{Time}, the {trade} met at the {noun} to trade news and mend nets.",
    "The road from the {noun} to the {noun2} is {adj} in places and lined with old stones.",
    "Someone planted hawthorn along the {noun}, and now the {creatures} nest there {time}.",
)


def filler_sentence(rng: random.Random) -> str:
    """One varied sentence of neutral prose (no numbers, no names) drawn from ``rng``."""
    time = rng.choice(_TIMES)
    noun, noun2 = rng.sample(_NOUNS, 2)
    return rng.choice(_TEMPLATES).format(
        adj=rng.choice(_ADJECTIVES), noun=noun, noun2=noun2, verb=rng.choice(_VERBS), time=time,
        Time=time[0].upper() + time[1:], creatures=rng.choice(_CREATURES), trade=rng.choice(_TRADES),
    )  # fmt: skip


@dataclass(frozen=True)
class Haystack:
    """A prompt fitted to its budget, with where the needle landed."""

    prompt: str
    haystack: str
    needle_offset: int
    """Character offset of the needle in ``haystack``."""
    tokens: int
    """Tokens of the whole prompt: system instruction, user prompt and chat-template overhead."""

    def depth(self, needle: str) -> float:
        """Where the needle sits: filler characters before it over all filler characters."""
        filler = len(self.haystack) - len(needle)
        return self.needle_offset / filler if filler > 0 else 0.0


def _render(sentences: list[str], breaks: list[bool], depth: float, needle: str) -> tuple[str, int]:
    """Filler paragraphs with the needle as its own paragraph before sentence ``round(depth * n)``."""
    at = round(depth * len(sentences))
    paragraphs: list[str] = []
    current: list[str] = []
    offset = 0
    for index, (sentence, new_paragraph) in enumerate(zip(sentences, breaks, strict=True)):
        if index == at or (new_paragraph and current):
            if current:
                paragraphs.append(" ".join(current))
                current = []
        if index == at:
            offset = sum(len(p) + 2 for p in paragraphs)
            paragraphs.append(needle)
        current.append(sentence)
    if current:
        paragraphs.append(" ".join(current))
    if at >= len(sentences):
        offset = sum(len(p) + 2 for p in paragraphs)
        paragraphs.append(needle)
    return "\n\n".join(paragraphs), offset


def build_haystack(
    rng: random.Random,
    target: int,
    depth: float,
    needle: str,
    frame: Callable[[str], str],
    system: str,
    config: LongContextConfig,
) -> Haystack:
    """Filler around ``needle`` at ``depth`` such that the framed prompt fills ``config.budget(target)``.

    The whole prompt (``system`` + ``frame(haystack)`` + chat overhead) ends within 2 % below its budget
    and never above it (a needle longer than the budget leaves no filler at all).
    """
    counter = token_counter(config.tokenizer)
    budget = config.budget(target)
    fixed = counter.count(system) + config.chat_overhead_tokens
    aim = budget * (1 + _FILL) / 2  # the middle of the accepted band, so one correction usually lands in it
    sentences: list[str] = []
    breaks: list[bool] = []
    words = 0

    def grow(tokens: float) -> None:
        nonlocal words
        goal = words + tokens / counter.tokens_per_word
        while words < goal:
            sentence = filler_sentence(rng)
            sentences.append(sentence)
            breaks.append(rng.random() < 0.22)
            words += len(sentence.split())

    grow(aim - fixed - counter.count(frame(needle)))
    for _ in range(12):
        haystack, offset = _render(sentences, breaks, depth, needle)
        prompt = frame(haystack)
        tokens = fixed + counter.count(prompt)
        if tokens > budget and sentences:
            words_per_sentence = words / len(sentences)
            drop = max(1, math.ceil((tokens - aim) / (counter.tokens_per_word * words_per_sentence)))
            words -= sum(len(s.split()) for s in sentences[-drop:])
            del sentences[-drop:], breaks[-drop:]
        elif tokens < _FILL * budget:
            grow(aim - tokens)
        else:
            break
    else:  # did not settle: re-render, trimming one sentence at a time until it fits
        while True:
            haystack, offset = _render(sentences, breaks, depth, needle)
            prompt = frame(haystack)
            tokens = fixed + counter.count(prompt)
            if tokens <= budget or not sentences:
                break
            del sentences[-1], breaks[-1]
    return Haystack(prompt=prompt, haystack=haystack, needle_offset=offset, tokens=tokens)
