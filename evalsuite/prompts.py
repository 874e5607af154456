"""System prompts of the eval tasks: one definition, imported by the Inspect tasks and by post-training, so a
model is trained on exactly the instruction it is judged with."""

TERMINAL_SYSTEM = (
    "You are working in a Linux shell inside the directory /workspace. Use the bash tool to inspect and "
    "change files; there is no network. When the task is done, reply with a short summary and stop "
    "calling tools."
)
DOCUMENTS_SYSTEM = (
    "You answer questions about business documents precisely. Copy values exactly as written. Always end "
    "your reply with a final line of the form 'ANSWER: <value>', for example 'ANSWER: 1,234.50'."
)
