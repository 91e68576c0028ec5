"""A story stages 3 and 4 both test: n > 1 groups and beam searches admitted into pools barely large enough (in a
module of its own, so that a stage's copy of the tests that imports it collects no other stage's tests)."""

from hypothesis import strategies as st

from pagedlab import LLM, BeamSearchParams, SamplingParams


def shared_admission_never_runs_out(tiny_model_dir, data, stage: int):
    """Random n > 1 groups and beam searches on pools barely large enough: admission by the shared
    worst case must never leave a running request without a block (the scheduler asserts it). Stage 4's
    test (prefix caching on) runs the same story: a stage-3 copy stubs stage 4's lookup."""
    block_size = data.draw(st.sampled_from([1, 2, 4]), label="block_size")
    groups = data.draw(
        st.lists(
            st.tuples(st.integers(1, 12), st.integers(1, 8), st.integers(1, 3), st.booleans()),
            min_size=1,
            max_size=5,
        ),
        label="groups (prompt_len, max_tokens, n or width, beam)",
    )
    worst = max(width * -(-(p + m - 1) // block_size) for p, m, width, _ in groups)
    llm = LLM(
        model=str(tiny_model_dir),
        stage=stage,
        block_size=block_size,
        num_kv_blocks=worst + data.draw(st.integers(0, 3), label="spare blocks"),
        max_num_seqs=8,
        debug_checks=True,
    )
    engine = llm.engine
    for i, (prompt_len, max_tokens, width, beam) in enumerate(groups):
        prompt = [3 + (i + j) % 20 for j in range(prompt_len)]
        if beam:
            engine.add_beam_request(f"r{i}", prompt, BeamSearchParams(beam_width=width, max_tokens=max_tokens))
        else:
            params = SamplingParams(n=width, temperature=1.0, seed=i, max_tokens=max_tokens, ignore_eos=True)
            engine.add_request(f"r{i}", prompt, params)
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    assert not engine.has_unfinished_requests()
    assert engine.kv_manager.num_used_blocks == 0
