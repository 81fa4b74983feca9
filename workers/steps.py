"""The scheduler's two kinds of model work, on its thread: a request's prefill and a batch's decode step.

    prefill(seq):  plan -> workers/pipeline.run_prefill over the request's stored chunks -> token eviction
                   (when asked) -> the first token's logits on the Sequence
    decode(seqs):  every running sequence's last token through the model in one batch
"""

from __future__ import annotations

import time

from workers.batching.sequence import Sequence
from workers.batching.step import decode_step
from workers.chunk_source import ChunkLoader
from workers.generate import DecodeHooks
from workers.pipeline import run_prefill
from workers.prompt import PromptLayout
from workers.requests import CompressionSpec
from workers.request_state import RequestState


class RequestSteps:
    def __init__(self, runner, loader: ChunkLoader, decode_weights, chunk_form: str):
        self.runner, self.loader, self.decode_weights, self.chunk_form = runner, loader, decode_weights, chunk_form

    def prefill(self, seq: Sequence) -> None:
        """Fill the cache by the request's plan, compress it when asked, leave the first token's logits."""
        begun = time.perf_counter()
        state: RequestState = seq.state
        layout = state.layout
        state.compressor = compressor = make_compressor(self.runner, seq.request.compression, layout)
        source = self.loader.for_request(seq.request.namespace, state.compressions, seq.stopped)
        out = run_prefill(self.runner, layout, state.plan, source, self.chunk_form,
                          observer=compressor.observer if compressor else None)
        self._remember(seq, out)  # before eviction changes the cache
        if state.shadow:
            state.first_logits = out.logits.reshape(-1).float().clone()
        if compressor is not None:
            compressor.prepare(self.runner, out.cache, layout.token_ids, (0, layout.suffix_start))
            compressor.compress(out.cache)
        state.prefill, state.ttft_s = out.stats, time.perf_counter() - state.start
        state.prompt_s, state.queued_s = seq.arrived - state.start, begun - seq.arrived
        seq.cache, seq.logits, seq.next_position = out.cache, out.logits, layout.num_tokens
        seq.hooks = compressor.decode_hooks() if compressor else DecodeHooks()
        seq.stop_ids = self.runner.stop_token_ids

    def _remember(self, seq: Sequence, out) -> None:
        """Keep the prompt's leading chunks exact for the next prompt that starts with them: an exact prefill
        stores its nodes now; a blended one queues an idle-time exact prefill of them (seq.background).
        Plain reuse reads nodes but never asks for them: it asked for no recompute."""
        sequences, state = self.loader.sequences, seq.state
        if sequences is None or not state.layout.chunk_spans or any(c is not None for c in state.compressions):
            return
        namespace = seq.request.namespace
        if not state.plan.stored_chunks:  # full, prefix: every entry is exact
            sequences.store_from(state.layout, out.cache, namespace, first=out.stats.sequence_chunks)
        elif state.plan.blend is not None and out.stats.sequence_chunks < len(state.layout.chunk_spans):
            job = sequences.fill_job(self.runner, state.layout, namespace)
            if job is not None:
                seq.background.append(job)

    def decode(self, seqs: list[Sequence]) -> None:
        logits = decode_step(self.runner, self.decode_weights, [s.tokens[-1] for s in seqs],
                             [s.next_position + len(s.tokens) - 1 for s in seqs], [s.cache for s in seqs],
                             [s.hooks.observer for s in seqs])
        for seq, row in zip(seqs, logits):
            seq.logits = row
            if seq.hooks.after_step is not None:
                seq.hooks.after_step(seq.cache)


def make_compressor(runner, spec: CompressionSpec | None, layout: PromptLayout):
    """The request's token-level eviction (workers/eviction), or None."""
    if spec is None or spec.policy == "none":
        return None
    from workers.eviction import make_compressor as make

    return make(spec, runner.shape, prefix_len=layout.prefix_len, prompt_len=layout.num_tokens,
                inv_freq=runner.inv_freq if runner.can_rerotate else None,
                scale=runner.layers[0].self_attn.scaling, question_start=layout.suffix_start)
