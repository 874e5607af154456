"""The training prompt set of an EAGLE-3 head: diverse chat requests the target then answers greedily.

Three sources, all made here (there is no dataset hub): the bundled training prompts, task templates
crossed with topics, and user turns the target model itself samples at temperature 1 from a seeded
meta-prompt (:data:`SELF_PROMPT`). Held-out prompts of the bundled set are removed, so acceptance measured
on them is measured on prompts never trained on.

A later, larger round appends :func:`extra_prompts` (a second template and topic bank crossed with the
first) after that base set, so every prompt already answered keeps its place and its shard.
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

#: The second bank :func:`extra_prompts` crosses with the first: other request shapes and subjects.
EXTRA_TOPICS = (
    "compound interest",
    "renewable energy",
    "time zones",
    "DNA",
    "the immune system",
    "the French Revolution",
    "ancient Egypt",
    "the Silk Road",
    "Shakespeare",
    "poetry",
    "photography",
    "architecture",
    "city planning",
    "public transport",
    "nuclear power",
    "wind turbines",
    "batteries",
    "semiconductors",
    "the cloud",
    "open-source software",
    "version control with git",
    "unit testing",
    "web browsers",
    "HTTP",
    "encryption",
    "social media",
    "online shopping",
    "remote work",
    "team meetings",
    "customer service",
    "marketing",
    "saving for retirement",
    "credit cards",
    "renting an apartment",
    "buying a used car",
    "houseplants",
    "composting",
    "bird watching",
    "astronomy",
    "telescopes",
    "the solar system",
    "Mars",
    "satellites",
    "the speed of light",
    "sound waves",
    "the human brain",
    "memory",
    "habits",
    "stress",
    "exercise",
    "nutrition",
    "vitamins",
    "allergies",
    "the common cold",
    "hospitals",
    "teachers",
    "homework",
    "exams",
    "universities",
    "scholarships",
    "volunteering",
    "elections",
    "the United Nations",
    "maps",
    "the Amazon rainforest",
    "glaciers",
    "hurricanes",
    "tornadoes",
    "snow",
    "clouds",
    "the seasons",
    "migration of birds",
    "whales",
    "octopuses",
    "ants",
    "wolves",
    "pandas",
    "frogs",
    "spiders",
    "bamboo",
    "cotton",
    "wool",
    "glass",
    "paper",
    "plastic",
    "steel",
    "bridges made of wood",
    "skyscrapers",
    "lighthouses",
    "submarines",
    "hot air balloons",
    "rockets",
    "clocks",
    "calendars",
    "money",
    "banks",
    "inflation",
    "supply and demand",
    "entrepreneurship",
    "negotiation",
    "leadership",
    "kindness",
    "gratitude",
    "curiosity",
    "creativity",
    "journaling",
    "reading books",
    "podcasts",
    "movies",
    "theater",
    "dance",
    "guitar",
    "piano",
    "singing",
    "knitting",
    "woodworking",
    "baking cookies",
    "making soup",
    "vegetarian cooking",
    "spices",
    "cheese",
    "apples",
)

EXTRA_TEMPLATES = (
    "What is {topic}?",
    "How does {topic} work?",
    "Describe {topic} in exactly two sentences.",
    "Why does {topic} matter in everyday life?",
    "Write a tweet about {topic}.",
    "Write a short poem about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "List five questions a student might ask about {topic}.",
    "Give me a fun fact about {topic}.",
    "What is the most common misconception about {topic}?",
    "Write a short news headline and summary about {topic}.",
    "Write an opening line for a novel about {topic}.",
    "Suggest a title for a blog post about {topic} and outline it.",
    "What would a world without {topic} look like?",
    "How has {topic} changed over the last hundred years?",
    "Give me a simple analogy that explains {topic}.",
    "What are three beginner mistakes with {topic}?",
    "Write a two-sentence horror story about {topic}.",
    "Write a short thank-you note that mentions {topic}.",
    "Plan a one-hour lesson about {topic}.",
    "What are the key terms someone should know about {topic}?",
    "Write a riddle whose answer is {topic}.",
    "How would you explain {topic} in one sentence?",
    "Describe {topic} using only simple words.",
    "Write a short speech for a school assembly about {topic}.",
    "What are some good books or resources for learning about {topic}?",
    "Argue for and against spending more money on {topic}.",
    "Write a short dialogue between a teacher and a student about {topic}.",
    "What careers are connected to {topic}?",
    "Give me a checklist for a weekend project about {topic}.",
    "How is {topic} related to {other}?",
    "Write a short advertisement for a workshop on {topic}.",
    "What are the environmental effects of {topic}?",
    "Explain the science behind {topic}.",
    "What would you tell a friend who is nervous about {topic}?",
    "Write a limerick about {topic} and {other}.",
    "Give three reasons people enjoy {topic}.",
    "What safety tips apply to {topic}?",
    "Summarize {topic} in three bullet points.",
    "Write a diary entry from the point of view of someone who loves {topic}.",
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


def extra_prompts(seed: int, count: int, exclude: set[str]) -> list[str]:
    """``count`` prompts of both banks' templates x topics, none in ``exclude``, in a seeded order.

    The order does not depend on ``count``, so a larger count extends a smaller one's list.
    """
    rng = random.Random(seed + 2)
    templates, topics = (*TEMPLATES, *EXTRA_TEMPLATES), (*TOPICS, *EXTRA_TOPICS)
    others = (*TOPICS[:12], *EXTRA_TOPICS[:12])
    combos = [(t, a, rng.choice([o for o in others if o != a])) for t in templates for a in topics]
    rng.shuffle(combos)
    prompts: list[str] = []
    seen = set(exclude)
    for template, topic, other in combos:
        if len(prompts) >= count:
            break
        prompt = template.format(topic=topic, other=other)
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts


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
