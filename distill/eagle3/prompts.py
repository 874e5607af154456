"""The training prompt set of an EAGLE-3 head: diverse chat requests the target then answers greedily.

Three sources, all made here (there is no dataset hub): the bundled training prompts, task templates
crossed with topics, and user turns the target model itself samples at temperature 1 from a seeded
meta-prompt (:data:`SELF_PROMPT`). Held-out prompts of the bundled set are removed, so acceptance measured
on them is measured on prompts never trained on.
"""

from __future__ import annotations

import random

from distill.prompts import load_prompts

TOPICS = (
    "volcanoes",
    "the moon",
    "bread baking",
    "chess",
    "photosynthesis",
    "the Roman Empire",
    "jazz",
    "climate change",
    "electric cars",
    "honeybees",
    "the stock market",
    "sleep",
    "coffee",
    "rainbows",
    "black holes",
    "the printing press",
    "vaccines",
    "coral reefs",
    "recycling",
    "the internet",
    "gardening",
    "origami",
    "the Olympic Games",
    "penguins",
    "solar panels",
    "friendship",
    "time management",
    "public speaking",
    "the water cycle",
    "dinosaurs",
    "machine learning",
    "a job interview",
    "budgeting",
    "learning a language",
    "the human heart",
    "bicycles",
    "tea",
    "deserts",
    "earthquakes",
    "mountains",
    "the ocean",
    "space travel",
    "robots",
    "libraries",
    "museums",
    "music theory",
    "painting",
    "football",
    "basketball",
    "running",
    "yoga",
    "meditation",
    "cooking pasta",
    "pizza",
    "chocolate",
    "birthdays",
    "winter",
    "summer holidays",
    "trains",
    "airplanes",
    "bridges",
    "castles",
    "pyramids",
    "the Renaissance",
    "democracy",
    "taxes",
    "a small business",
    "email etiquette",
    "passwords",
    "smartphones",
    "video games",
    "board games",
    "cats",
    "dogs",
    "horses",
    "elephants",
    "owls",
    "sharks",
    "butterflies",
    "trees",
    "mushrooms",
    "rivers",
    "lakes",
    "weather forecasts",
    "the periodic table",
    "gravity",
    "magnets",
    "electricity",
    "fractions",
    "prime numbers",
    "geometry",
    "statistics",
    "Python programming",
    "sorting algorithms",
    "databases",
    "spreadsheets",
    "writing a resume",
    "moving to a new city",
    "a picnic",
    "camping",
    "first aid",
    "healthy breakfast",
    "drinking water",
    "recipes with rice",
)

TEMPLATES = (
    "Explain {topic} to a beginner.",
    "Write a short paragraph about {topic}.",
    "Give me three interesting facts about {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a haiku about {topic}.",
    "Write a short story that involves {topic}.",
    "How would you describe {topic} to a child?",
    "List five tips related to {topic}.",
    "What is the history of {topic}?",
    "Why is {topic} important?",
    "Write a limerick about {topic}.",
    "Summarize the main ideas behind {topic} in two sentences.",
    "What are common misconceptions about {topic}?",
    "Write a friendly email to a colleague about {topic}.",
    "Create a short quiz with three questions about {topic}.",
    "Compare {topic} and {other}.",
    "What do {topic} and {other} have in common?",
    "Write a product description for something related to {topic}.",
    "Give step-by-step instructions for getting started with {topic}.",
    "Write a motivational message that mentions {topic}.",
    "Tell me a joke about {topic}.",
    "What questions should I ask an expert on {topic}?",
    "Describe a typical day of someone who works with {topic}.",
    "Write a short dialogue between two friends about {topic}.",
)

SELF_PROMPT = (
    "Write one question or request that a user might send to an AI assistant about {topic}. "
    "Reply with the request only."
)


def template_prompts(seed: int, count: int) -> list[str]:
    """``count`` distinct template x topic prompts in a seeded order."""
    rng = random.Random(seed)
    prompts = set()
    combos = [(t, a, b) for t in TEMPLATES for a in TOPICS for b in TOPICS[:12] if a != b]
    rng.shuffle(combos)
    for template, topic, other in combos:
        prompts.add(template.format(topic=topic, other=other))
        if len(prompts) >= count:
            break
    ordered = sorted(prompts)
    rng.shuffle(ordered)
    return ordered


def self_prompt_requests(seed: int, count: int) -> list[str]:
    """Meta-prompts for the target to sample user turns from (one per wanted user turn)."""
    rng = random.Random(seed + 1)
    return [SELF_PROMPT.format(topic=rng.choice(TOPICS)) for _ in range(count)]


def clean_user_turn(text: str) -> str | None:
    """A sampled user turn, trimmed to its first line and unquoted; None when unusable."""
    line = next((part.strip() for part in text.strip().splitlines() if part.strip()), "")
    line = line.strip().strip('"').strip("'").strip()
    for prefix in ("Question:", "Request:", "User:"):
        if line.startswith(prefix):
            line = line[len(prefix) :].strip()
    return line if 10 <= len(line) <= 400 else None


def training_prompts(template_count: int, self_generated: list[str], seed: int) -> list[str]:
    """The deduplicated training prompts: bundled train split, templates, sampled user turns; held-out removed."""
    heldout = set(load_prompts(split="heldout"))
    ordered: list[str] = []
    seen: set[str] = set()
    for prompt in [*load_prompts(split="train"), *template_prompts(seed, template_count), *self_generated]:
        if prompt not in seen and prompt not in heldout:
            seen.add(prompt)
            ordered.append(prompt)
    random.Random(seed).shuffle(ordered)
    return ordered
