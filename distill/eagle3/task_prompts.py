"""A third prompt bank: the request kinds the topic banks lack.

The template and extra banks cross essay-shaped requests with topics ("Write a short paragraph about
{topic}"). Real chat traffic, and the bundled set's own one-off prompts, also ask for code, queries,
regular expressions, shell commands, translations, arithmetic, unit conversions, short facts and
practical writing. A head trained on essays alone drafts those poorly: its vocabulary lacks their tokens
(symbols, foreign words, byte pieces of emoji) and their answers follow other patterns. Each kind here is a
few templates crossed with its own subject list, so the bank grows without repeating a request.

The bundled held-out prompts are excluded by the caller (exactly, as the other banks do), and no subject
here is one of theirs (no email regex, no "good morning" translation, no HTTP, no bakery name), so held-out
acceptance stays a measurement on requests the head has not seen.
"""

from __future__ import annotations

import random
from collections.abc import Callable

LANGUAGES = ("Python", "JavaScript", "TypeScript", "Java", "C", "C++", "Go", "Rust", "Ruby", "PHP")

CODE_TASKS = (
    "reverses a string",
    "checks if a string is a palindrome",
    "computes the factorial of n",
    "returns the nth Fibonacci number",
    "finds the largest number in a list",
    "counts the vowels in a string",
    "merges two sorted lists",
    "removes duplicates from a list",
    "converts Celsius to Fahrenheit",
    "checks if a year is a leap year",
    "sums the digits of an integer",
    "counts how often each word appears in a text",
    "checks if two strings are anagrams",
    "returns the second largest number in a list",
    "flattens a nested list",
    "computes the greatest common divisor of two numbers",
    "validates a password's length and characters",
    "sorts a list of names alphabetically",
    "reads a file and counts its lines",
    "finds the average of a list of numbers",
    "capitalizes the first letter of every word",
    "checks if a number is even",
    "generates a random password",
    "converts a number to binary",
    "implements binary search",
    "implements bubble sort",
    "returns the prime numbers below n",
    "removes whitespace from both ends of a string",
    "computes the area of a circle",
    "parses a date string",
)

HOW_TO_CODE = (
    "read a JSON file",
    "make an HTTP request",
    "sort a dictionary by value",
    "handle exceptions",
    "write a unit test",
    "split a string by commas",
    "get the current date and time",
    "iterate over a dictionary",
    "create a class",
    "remove an item from a list",
    "concatenate strings",
    "check if a key exists in a map",
    "convert a string to an integer",
    "use a for loop",
    "define a function with default arguments",
)

SQL_TASKS = (
    "selects the ten most recent rows from {table}",
    "finds duplicate emails in {table}",
    "computes the average price in {table}",
    "deletes rows older than a year from {table}",
    "joins {table} with a table named accounts",
    "groups {table} by country and counts each group",
    "updates the status of one row in {table}",
    "creates a table named {table} with an id and a name",
    "finds the maximum value of the amount column in {table}",
)
SQL_TABLES = ("users", "orders", "products", "employees", "customers", "payments", "books", "events")

REGEX_TASKS = (
    "a US phone number",
    "a date in YYYY-MM-DD format",
    "a URL",
    "an IPv4 address",
    "a hexadecimal color code",
    "a postal code",
    "a time in 24-hour format",
    "a word that starts with a capital letter",
    "a number with two decimal places",
    "a username of 3 to 16 letters, digits or underscores",
    "a line that ends with a question mark",
)

SHELL_TASKS = (
    "lists all files modified in the last day",
    "counts the lines in every Python file in a folder",
    "finds the ten largest files in a directory",
    "renames every .txt file to .md",
    "shows the disk usage of each folder",
    "searches for a word in all files recursively",
    "prints the last 20 lines of a log file",
    "kills a process by name",
    "compresses a folder into a tar.gz archive",
    "shows which process uses port 8080",
    "counts the unique lines in a file",
    "downloads a file from a URL",
)

PHRASES = (
    "where is the train station?",
    "thank you very much",
    "I would like a cup of coffee",
    "what time is it?",
    "the weather is nice today",
    "I am learning a new language",
    "how much does this cost?",
    "nice to meet you",
    "can you help me, please?",
    "I love reading books",
    "see you tomorrow",
    "my name is Anna",
    "the library opens at nine",
    "happy birthday",
)
TRANSLATE_INTO = ("Spanish", "French", "German", "Italian", "Portuguese", "Dutch", "Japanese", "Chinese")

ACRONYMS = (
    "HTML", "CSS", "URL", "CPU", "GPU", "RAM", "USB", "NASA", "DNA", "RNA", "GDP", "FAQ", "PDF",
    "SQL", "API", "JSON", "VPN", "WiFi", "GPS", "LED", "UNESCO", "WHO", "ATM", "PIN", "ASAP", "CEO", "HR",
    "IoT", "AI", "SSD", "ISP", "DIY", "RSVP", "UFO", "BMI", "ETA", "LCD", "SMS", "NGO",
)  # fmt: skip

COUNTRIES = (
    "France", "Japan", "Brazil", "Canada", "Australia", "Kenya", "Egypt", "India", "Mexico", "Norway",
    "Spain", "Italy", "Germany", "Argentina", "Chile", "Peru", "Vietnam", "Thailand", "Turkey", "Greece",
    "Poland", "Sweden", "Finland", "Portugal", "Ireland", "Morocco", "Nigeria", "South Korea", "Indonesia",
    "New Zealand",
)  # fmt: skip

FACT_QUESTIONS = (
    "What is the capital of {country}?",
    "What language is spoken in {country}?",
    "What currency is used in {country}?",
    "What is {country} famous for?",
    "What is the population of {country}, roughly?",
)

INVENTIONS = (
    "the telephone", "the light bulb", "the printing press", "the airplane", "the World Wide Web",
    "the steam engine", "penicillin", "the radio", "the television", "the bicycle", "the camera",
    "the microscope", "the compass", "paper", "the thermometer", "the vaccine", "the computer mouse",
    "the refrigerator", "the typewriter", "the battery",
)  # fmt: skip

SCIENCE_QUESTIONS = (
    "What is the boiling point of {substance}?",
    "What is the melting point of {substance}?",
    "What is the chemical formula of {substance}?",
    "Is {substance} a metal?",
)
SUBSTANCES = (
    "methane",
    "iron",
    "gold",
    "salt",
    "ethanol",
    "oxygen",
    "copper",
    "aluminium",
    "mercury",
    "sugar",
)

CONCEPTS = (
    "a prime number", "a neural network", "an API", "recursion", "a black hole", "inflation", "an atom",
    "a virus", "a database index", "a compiler", "an algorithm", "a photon", "an ecosystem", "a democracy",
    "a mortgage", "a metaphor", "a fraction", "a hash table", "a cell membrane", "a galaxy", "osmosis",
    "entropy", "a sonnet", "an allergy", "a tariff", "a peninsula", "a catalyst", "a vector", "a loop in programming",
    "a stock dividend", "an antibiotic", "a volcano", "a time zone", "a web server",
)  # fmt: skip

DIFFERENCES = (
    ("weather", "climate"), ("a virus", "a bacterium"), ("a list", "a tuple in Python"), ("RAM", "storage"),
    ("speed", "velocity"), ("a crocodile", "an alligator"), ("an astronomer", "an astrologer"),
    ("HTTP", "HTTPS"), ("a lake", "a pond"), ("mass", "weight"), ("a simile", "a metaphor"),
    ("TCP", "UDP"), ("a debit card", "a credit card"), ("a comet", "an asteroid"), ("Git", "GitHub"),
    ("a stock", "a bond"), ("an ocean", "a sea"), ("a frog", "a toad"), ("a compiler", "an interpreter"),
    ("baking soda", "baking powder"),
)  # fmt: skip

UNITS = (
    ("kilometres", "miles"), ("miles", "kilometres"), ("kilograms", "pounds"), ("pounds", "kilograms"),
    ("litres", "gallons"), ("inches", "centimetres"), ("feet", "metres"), ("degrees Celsius", "degrees Fahrenheit"),
    ("degrees Fahrenheit", "degrees Celsius"), ("hours", "minutes"), ("days", "seconds"), ("ounces", "grams"),
)  # fmt: skip

DISHES = (
    "pancakes", "tomato soup", "banana bread", "guacamole", "fried rice", "omelette", "lemonade",
    "chocolate chip cookies", "a vegetable curry", "hummus", "a Greek salad", "spaghetti carbonara",
    "oatmeal", "a smoothie", "roast chicken", "lentil soup", "apple pie", "pizza dough", "mashed potatoes",
    "iced tea",
)  # fmt: skip

CITIES = (
    "Rome", "Paris", "Tokyo", "Barcelona", "New York", "Lisbon", "Prague", "Istanbul", "Kyoto", "Vienna",
    "Amsterdam", "Cairo", "Sydney", "Mexico City", "Berlin", "Budapest", "Edinburgh", "Seoul", "Marrakech",
    "Buenos Aires",
)  # fmt: skip

EMAIL_PURPOSES = (
    "asking my manager for a day off next Friday",
    "thanking a client for a meeting",
    "apologizing for a late reply",
    "inviting colleagues to a team lunch",
    "asking a professor for an extension",
    "following up on a job application",
    "declining a meeting invitation",
    "reminding a friend about money they owe",
    "requesting a refund for a broken product",
    "introducing myself to a new team",
    "asking a landlord to fix the heating",
    "congratulating a colleague on a promotion",
)

PRACTICAL = (
    "Give me a recipe for {dish}.",
    "Plan a three-day trip to {city}.",
    "What should I see in {city} in one day?",
    "Write a polite email {purpose}.",
    "Give me a packing list for a trip to {city}.",
    "Suggest a name for a small {shop} and explain it.",
    "Write a tweet announcing a new {shop} opening in {city}, with emojis.",
    "Write a short review of a {shop} in {city}.",
)
SHOPS = (
    "bookshop", "coffee shop", "bike repair shop", "flower shop", "pizza place", "yoga studio",
    "pet shop", "tea house", "vegan restaurant",
)  # fmt: skip

OPENINGS = (
    "The door was already open.",
    "Nobody expected the robot to cry.",
    "It rained for forty days.",
    "The letter had no return address.",
    "She found a key in the bread.",
    "The last train left without him.",
    "On Mars, the mornings were quiet.",
    "The cat knew something we did not.",
)


HOW_TOS = (
    "make a cup of green tea", "improve my handwriting", "fall asleep faster", "change a flat tyre",
    "start running", "save money on groceries", "learn to touch type", "remove a coffee stain",
    "grow tomatoes on a balcony", "prepare for an exam", "write a good cover letter", "clean a laptop keyboard",
    "keep houseplants alive", "plan a birthday party", "back up my phone", "stop procrastinating",
    "make new friends in a new city", "tie a tie", "boil an egg", "choose a good password",
)  # fmt: skip

PHENOMENA = (
    "the sky blue", "the sea salty", "ice slippery", "the Moon sometimes visible during the day",
    "bread brown when toasted", "the grass green", "a rainbow curved", "thunder loud", "snow white",
    "the Sun hot", "a balloon able to float", "a cat's purr soothing", "honey slow to spoil",
    "the Earth round", "a yawn contagious",
)  # fmt: skip

ACTIVITIES = (
    "a job interview", "public speaking", "learning to cook", "a first marathon", "working from home",
    "a long flight", "studying for exams", "a camping trip", "saving for a house", "learning the guitar",
    "taking better photos", "a first day at a new job", "writing a novel", "staying focused", "moving house",
)  # fmt: skip

#: Operands of the arithmetic kind: a small pool, so its requests run out like the other kinds'.
OPERANDS = (12, 15, 17, 23, 24, 36, 48, 75)


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.choice(OPERANDS), rng.choice(OPERANDS)
    kinds = (
        f"What is {a} times {b}? Show your steps.",
        f"What is {a * b} divided by {b}?",
        f"What is {a}% of {b * 10}?",
        f"Solve for x: {a % 9 + 2}x + {b} = {b + (a % 9 + 2) * (a % 7 + 1)}.",
        f"If a train travels {a * 5} km in {a % 4 + 2} hours, what is its average speed?",
        f"I have {a} apples and give away {b % a}. How many are left?",
        f"What is the square root of {a * a}?",
        f"Round {a}.{b} to the nearest whole number.",
    )
    return rng.choice(kinds)


def _conversion(rng: random.Random) -> str:
    source, target = rng.choice(UNITS)
    return f"Convert {rng.choice((1, 2, 3, 5, 10, 12, 20, 25, 50, 100))} {source} to {target}."


def _kinds() -> list[Callable[[random.Random], str]]:
    """One drawing function per request kind; each call picks a template and its subjects."""
    return [
        lambda r: f"Write a {r.choice(LANGUAGES)} function that {r.choice(CODE_TASKS)}.",
        lambda r: f"How do I {r.choice(HOW_TO_CODE)} in {r.choice(LANGUAGES)}?",
        lambda r: f"Write a SQL query that {r.choice(SQL_TASKS).format(table=r.choice(SQL_TABLES))}.",
        lambda r: f"Write a regular expression that matches {r.choice(REGEX_TASKS)}.",
        lambda r: f"Write a bash command that {r.choice(SHELL_TASKS)}.",
        lambda r: f"Translate '{r.choice(PHRASES)}' into {r.choice(TRANSLATE_INTO)}.",
        lambda r: f"What does {r.choice(ACRONYMS)} stand for?",
        lambda r: r.choice(FACT_QUESTIONS).format(country=r.choice(COUNTRIES)),
        lambda r: f"Who invented {r.choice(INVENTIONS)}?",
        lambda r: r.choice(SCIENCE_QUESTIONS).format(substance=r.choice(SUBSTANCES)),
        lambda r: f"What is {r.choice(CONCEPTS)}?",
        lambda r: "What is the difference between {} and {}?".format(*r.choice(DIFFERENCES)),
        _arithmetic,
        _conversion,
        lambda r: r.choice(PRACTICAL).format(
            dish=r.choice(DISHES),
            city=r.choice(CITIES),
            purpose=r.choice(EMAIL_PURPOSES),
            shop=r.choice(SHOPS),
        ),
        lambda r: f"Write a short story that starts with '{r.choice(OPENINGS)}'",
        lambda r: f"How do I {r.choice(HOW_TOS)}?",
        lambda r: f"Why is {r.choice(PHENOMENA)}?",
        lambda r: f"Give me tips for {r.choice(ACTIVITIES)}.",
    ]


def task_prompts(seed: int, count: int, exclude: set[str]) -> list[str]:
    """``count`` distinct requests, the kinds taken in turn, none in ``exclude``, in a seeded order.

    The order does not depend on ``count`` (a larger count extends a smaller one's list). A kind that
    draws nothing new in 50 tries is spent and left out of the turn; when every kind is spent the list is
    shorter than ``count``.
    """
    rng = random.Random(seed + 3)
    live = _kinds()
    prompts: list[str] = []
    seen = set(exclude)
    turn = 0
    while len(prompts) < count and live:
        kind = live[turn % len(live)]
        fresh = next((p for p in (kind(rng) for _ in range(50)) if p not in seen), None)
        if fresh is None:
            live.remove(kind)
            continue
        seen.add(fresh)
        prompts.append(fresh)
        turn += 1
    return prompts
