"""Episodes as tokens, through the policy's own chat template (ChatML + Hermes tools for the bundled model).

Token in, token out: the policy's sampled tokens are kept exactly as sampled, and everything between two of its
turns (the template's end of the assistant turn, the ``tool`` turn with the results, the next generation
prompt) is rendered by the chat template and tokenised on its own, exactly as the tokens the policy was then
fed. So the learner trains on the sequence the policy saw, and the loss mask marks the policy's tokens only.
"""

from __future__ import annotations

from typing import Any

from posttrain.episodes.tool_calls import ServedToolCalls, ToolSpec
from posttrain.errors import PosttrainError

Message = dict[str, Any]
# A probe conversation whose rendering brackets one assistant turn (any short text works).
_PROBE: list[Message] = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]


class TranscriptRenderer:
    """Renders one family's episodes for one tokenizer: the prompt, the tool turns, reference assistant turns,
    and reads turns back with the served tool parser."""

    def __init__(self, tokenizer: Any, tools: list[ToolSpec], parser: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.protocol = ServedToolCalls(tokenizer, tools, parser)
        self.tools = self.protocol.template_tools
        eos = tokenizer.eos_token
        if eos is None or tokenizer.eos_token_id is None:
            raise PosttrainError("the policy's tokenizer has no eos token to end its turns with")
        self.eos_id: int = int(tokenizer.eos_token_id)
        closed = self.render(_PROBE)
        end = closed.rfind("!" + eos)
        if end < 0:
            raise PosttrainError(
                "the chat template does not end an assistant turn with the eos token; multi-turn episodes need "
                "a template whose turns end where generation stops"
            )
        # What the template writes after a turn's eos (ChatML: a newline), part of the next turn's tokens.
        self.turn_tail = closed[end + 1 + len(eos) :]

    def render(self, messages: list[Message], generation_prompt: bool = False) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        # Chat text carries its own special tokens (vLLM tokenises rendered chats the same way).
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The opening messages with the tools and the generation prompt, as the served model gets them."""
        return self.encode(self.render(messages, generation_prompt=True))

    def tool_turn_ids(self, results: list[Message]) -> list[int]:
        """What follows a closed assistant turn: the template's turn tail, the ``tool`` messages, the next
        generation prompt."""
        before = self.render(_PROBE)
        after = self.render([*_PROBE, *results], generation_prompt=True)
        if not after.startswith(before):
            raise PosttrainError(
                "the chat template renders earlier turns differently once tool results follow"
            )
        return self.encode(self.turn_tail + after[len(before) :])

    def assistant_ids(self, message: Message) -> list[int]:
        """A whole assistant turn as the template renders it (content, tool calls, eos): what a policy that
        answers exactly like the demonstration generates after the generation prompt."""
        before = self.render(_PROBE[:1], generation_prompt=True)
        after = self.render([*_PROBE[:1], message])
        body = after[len(before) :]
        closing = self.tokenizer.eos_token + self.turn_tail
        if not after.startswith(before) or not body.endswith(closing):
            raise PosttrainError(
                "the chat template does not render an assistant turn after its generation prompt"
            )
        return self.encode(body[: len(body) - len(self.turn_tail)])

    def turn_text(self, token_ids: list[int]) -> str:
        """One turn's text as the served parser reads it: special tokens kept (the parser's ``adjust_request``
        turns skipping them off), the closing eos not part of it."""
        ids = token_ids[:-1] if token_ids and token_ids[-1] == self.eos_id else token_ids
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))
