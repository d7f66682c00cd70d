"""The transcript events of a streamed transcription: deltas that concatenate exactly to
the final text, whatever whitespace the segments carry."""

from __future__ import annotations

import pytest

from jacana_common.pb.jacana.asr.v1 import asr_pb2 as pb
from jacana_gateway.translate.audio_stream import DeltaText, events


@pytest.mark.parametrize(
    "texts",
    [
        [" Hello there.", " General Kenobi."],
        ["  ", " Hello", "   ", " there. ", "\n", " Again.  "],
        [" One.", " "],
        ["", " "],
        [" Ünïcödé", " text ", " after"],
    ],
)
def test_deltas_concatenate_to_the_stripped_text(texts):
    text = DeltaText()
    deltas = [text.delta(t) for t in texts]
    assert "".join(deltas) == "".join(texts).strip()
    assert all(deltas[i] or not texts[i].strip() for i in range(len(texts)))


def test_segments_without_text_send_no_delta():
    batch = pb.SegmentBatch(segments=[pb.Segment(text="  "), pb.Segment(text=" Hi.")])
    sent = list(events(pb.TranscribeStreamEvent(segments=batch), DeltaText()))
    assert sent == [{"type": "transcript.text.delta", "delta": "Hi."}]
