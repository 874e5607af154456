"""Traffic: replays a private eval set built from captured, de-identified gateway traffic
(``tandem traffic build-set``) against a model.

A replay family (:func:`evalsuite.registry.replay_family`): it runs only when named, with its set,
``tandem eval --model M --families traffic --traffic-set traffic-NAME@PERIOD --split test``, and stays out of
the generated suite the gate and post-training use. Items with a verifiable signal (JSON, a tool call) are
scored automatically; the rest are logged as needing review (see ``task``). :func:`read_answers` reads the
answers back from the logs, for blind review of a candidate against a baseline.

This ``__init__`` imports no Inspect.
"""

from evalsuite.families.traffic.answers import TrafficAnswer, read_answers
from evalsuite.families.traffic.items import (
    EVALSET_KIND,
    ITEMS_FILE,
    SET_PREFIX,
    SET_SPLITS,
    EvalSetItem,
    Signal,
    load_set,
)
from evalsuite.families.traffic.verifier import verify_json, verify_tool_calls
from evalsuite.registry import replay_family

replay_family(
    "traffic",
    task="evalsuite.families.traffic.task:traffic",
    options={
        "set": "the eval set to replay, traffic-NAME@PERIOD (`tandem eval --traffic-set`)",
        "registry": "registry URL holding the set (default $TANDEM_REGISTRY)",
    },
    required=("set",),
)

__all__ = [
    "EVALSET_KIND",
    "ITEMS_FILE",
    "SET_PREFIX",
    "SET_SPLITS",
    "EvalSetItem",
    "Signal",
    "TrafficAnswer",
    "load_set",
    "read_answers",
    "verify_json",
    "verify_tool_calls",
]
