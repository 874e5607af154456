"""The terminal family's system prompt (the Inspect task gives the model a bash tool)."""

TERMINAL_SYSTEM = (
    "You are working in a Linux shell inside the directory /workspace. Use the bash tool to inspect and "
    "change files; there is no network. When the task is done, reply with a short summary and stop "
    "calling tools."
)
