"""The documents family's prompts: the system instruction, and the answer format each question ends with.

Post-training trains on the same system instruction, so a model learns exactly what it is judged with.
"""

DOCUMENTS_SYSTEM = (
    "You answer questions about business documents precisely. Copy values exactly as written. Always end "
    "your reply with a final line of the form 'ANSWER: <value>', for example 'ANSWER: 1,234.50'."
)
ANSWER_INSTRUCTION = "Reply with your reasoning if you like, then finish with one line: ANSWER: <value>"
