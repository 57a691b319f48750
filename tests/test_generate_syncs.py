"""bench.generate_syncs on a CPU: the origin of a sync and the refusal without a GPU."""

from __future__ import annotations

import traceback

from bench import generate_syncs


def frame(filename: str, name: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(filename, 7, name)


def test_origin_is_the_innermost_frame_of_this_project_then_of_transformers() -> None:
    stack = [
        frame("/x/site-packages/transformers/generation/utils.py", "generate"),
        frame("/repo/common/integrations/transformers.py", "ladder_mask"),
        frame("/x/site-packages/transformers/masking_utils.py", "sdpa_mask"),
        frame("/x/site-packages/torch/_tensor.py", "__bool__"),
    ]
    assert generate_syncs.origin(stack) == "/repo/common/integrations/transformers.py:7 (ladder_mask)"
    assert generate_syncs.origin(stack[:1] + stack[2:]) == "transformers/masking_utils.py:7 (sdpa_mask)"
    assert generate_syncs.origin(stack[3:]) == "torch/_tensor.py:7 (__bool__)"
