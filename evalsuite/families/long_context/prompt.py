"""The long-context family's prompts: the system instruction, the frame around the haystack and the answer format.

Post-training trains on the same system instruction, so a model learns exactly what it is judged with.
"""

LONG_CONTEXT_SYSTEM = (
    "You read long documents carefully and answer questions about a single fact hidden in them. Copy the "
    "fact exactly as written. Always end your reply with a final line of the form 'ANSWER: <value>'."
)
DOCUMENT_INTRO = (
    "Below is a long collection of field notes. Exactly one passage in it holds the fact the question asks "
    "about; everything else is unrelated."
)
ANSWER_INSTRUCTION = "Finish with one line: ANSWER: <value>"


def frame(haystack: str, question: str) -> str:
    """The user prompt: introduction, the haystack between markers, then the question."""
    return f"{DOCUMENT_INTRO}\n\n<notes>\n{haystack}\n</notes>\n\nQuestion: {question} {ANSWER_INSTRUCTION}"
