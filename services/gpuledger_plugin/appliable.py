"""Whether the node's runtime can apply an Allocate answer: its device nodes exist here, and a
CDI spec of the runtime's defines every CDI device it names.

The plugin refuses, before kubelet admits the pod, an answer that fails this: kubelet would admit
it and the runtime fail its container afterwards with a message that names no card (or, for a
device node, start it without one); refused, kubelet fails the pod with this message.
"""

from __future__ import annotations

import os

from gpuledger_plugin.answer import Answer, AnswerPolicy
from gpuledger_plugin.cdi_specs import CdiSpecs


def unappliable(planned: Answer, policy: AnswerPolicy, cdi: CdiSpecs) -> str:
    """Why the runtime could not apply ``planned``; empty when it could."""
    missing = [d.host_path for d in planned.devices if not os.path.exists(d.host_path)]
    if missing:
        return (
            f"the device nodes {', '.join(missing)} do not exist on "
            f"this node (is the NVIDIA driver loaded? device_dir is {policy.device_dir})"
        )
    named = [*planned.cdi_devices, *(n for v in planned.annotations.values() for n in v.split(",") if n)]
    unknown = cdi.unresolved(named) if named else []
    if unknown:
        return (
            f"no CDI spec in {', '.join(cdi.dirs)} defines the devices {', '.join(unknown)} "
            "(has the NVIDIA container toolkit written its spec, e.g. with nvidia-ctk cdi generate? "
            "cdi_spec_dirs must be the runtime's)"
        )
    return ""
