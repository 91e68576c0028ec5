"""Stage 1: turn updated requests into vLLM-shaped `RequestOutput`s: text, stop strings, n > 1 groups.

Builds on: outputs.py, request.py, model/tokenizer.py.
Read with: chapters/01-contiguous-static.md.

Token-level stops (EOS, stop token ids, lengths) are the scheduler's
(`check_stop`); stop strings need text, so they are found here, after
detokenizing, and the engine then finishes the request (as vLLM's output
processor does). A stop string is cut from the text; the tokens that formed
it stay in `token_ids`.

Text grows incrementally: each request keeps an `IncrementalDetokenizer`, so a
step decodes only the tokens it produced, and a stop string is searched for
only where it could newly end (vLLM: vllm/v1/engine/detokenizer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedlab.outputs import BeamSearchSequence, CompletionOutput, RequestOutput
from pagedlab.request import Request

if TYPE_CHECKING:  # the tokenizers library: only where a model has a tokenizer
    from pagedlab.model.tokenizer import IncrementalDetokenizer, Tokenizer


class OutputProcessor:
    """Each live request's text (detokenizer, stop-string cut). The engine owns the request table and hands
    the groups in; what is kept here for a request is dropped when its group's final output is made."""

    def __init__(self, tokenizer: Tokenizer | None):
        self.tokenizer = tokenizer
        self.stopped_text: dict[str, str] = {}  # request_id -> text cut at its stop string
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}  # request_id -> its text so far

    def find_stop_strings(self, requests: list[Request]) -> list[Request]:
        """Requests whose text now contains one of their stop strings (text is cut there)."""
        hits = []
        for r in requests:
            stops = r.sampling_params.stop
            if not stops or self.tokenizer is None or r.request_id in self.stopped_text:
                continue
            checked = len(self._detokenizer(r).text)  # no stop string ended in the text before this step
            text = self._text(r)
            cuts = [i for i in (text.find(s, max(0, checked - len(s) + 1)) for s in stops) if i >= 0]
            if cuts:
                self.stopped_text[r.request_id] = text[: min(cuts)]
                hits.append(r)
        return hits

    def make_outputs(self, groups: list[tuple[Request, ...]]) -> list[RequestOutput]:
        """One RequestOutput per group (its children in child order); a finished group's text state is dropped."""
        outputs = [self._output(children) for children in groups]
        for children, out in zip(groups, outputs):
            if out.finished:
                for child in children:
                    self.stopped_text.pop(child.request_id, None)
                    self.detokenizers.pop(child.request_id, None)
        return outputs

    def with_text(self, beams: list[BeamSearchSequence], num_prompt_tokens: int) -> list[BeamSearchSequence]:
        """Fill each finished beam's text: its output tokens decoded (EOS left out)."""
        for beam in beams:
            beam.text = self.tokenizer.decode(beam.tokens[num_prompt_tokens:]) if self.tokenizer else None
        return beams

    def _detokenizer(self, r: Request) -> IncrementalDetokenizer:
        if r.request_id not in self.detokenizers:
            self.detokenizers[r.request_id] = self.tokenizer.detokenizer(skip=r.num_prompt_tokens)
        return self.detokenizers[r.request_id]

    def _text(self, r: Request) -> str:
        """r's output text, decoding only the tokens that arrived since it was last asked for."""
        return self._detokenizer(r).update(r.all_token_ids, finished=r.status.is_finished())

    def _output(self, children: tuple[Request, ...]) -> RequestOutput:
        first = children[0]
        completions = [self._completion(c) for c in children]
        return RequestOutput(
            request_id=first.group_id,
            prompt=first.prompt,
            prompt_token_ids=list(first.prompt_token_ids),
            outputs=completions,
            finished=all(c.finish_reason is not None for c in completions),
            metrics={
                "arrival_time": first.arrival_time,
                "first_token_time": min((c.first_token_time for c in children if c.first_token_time), default=None),
                "finished_time": max((c.finished_time or 0 for c in children), default=None),
            },
            num_cached_tokens=first.num_cached_tokens or 0,
        )

    def _completion(self, r: Request) -> CompletionOutput:
        text = self.stopped_text.get(r.request_id)
        if text is None:
            text = self._text(r) if self.tokenizer else ""
        return CompletionOutput(
            index=r.child_index,
            text=text,
            token_ids=r.output_token_ids,
            cumulative_logprob=r.cumulative_logprob,
            logprobs=list(r.top_logprobs) if r.sampling_params.logprobs is not None else None,
            finish_reason=r.status.finish_reason,
        )
