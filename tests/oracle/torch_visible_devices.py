"""Record how torch reads CUDA_VISIBLE_DEVICES (its ``_parse_visible_devices`` and the UUID matching of
``_transform_uuid_to_ordinals``) for a list of masks, as the golden tests/tune/workers/test_gpus_visible.py holds
fi-autotune's own reading to. Runs on CPU; re-record after a torch upgrade:

    python tests/oracle/torch_visible_devices.py   # writes tests/data/torch-visible-devices.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "torch-visible-devices.json"
#: The machine's GPUs in NVML order, as the test's MACHINE lists them (two share a UUID prefix).
UUIDS = ["GPU-0a1b2c3d-0000-4000-8000-000000000000", "GPU-0a1b9999-0000-4000-8000-000000000001",
         "GPU-7f000000-0000-4000-8000-000000000002", "GPU-8e000000-0000-4000-8000-000000000003"]
MASKS = ["", "0", "2", "3,0", " 1 , 2 ", "0,7,1", "0,2,-1,1", "0,,1", "1,1,2", "1gpu,2x", "+1,2", "-2,1", "1,none,2",
         "none", "GPU-7f", "GPU-0a1b", "GPU-7f,GPU-7f0", "GPU-8e000000-0000-4000-8000-000000000003,0", "GPU-8E000000",
         "GPU-7f,gpu-8e", "0,GPU-7f", "MIG-a,MIG-b", "MIG-a,MIG-a", "MIG-a,0"]


def main() -> None:
    import torch
    import torch.cuda as tc

    cases = []
    for mask in MASKS:
        os.environ["CUDA_VISIBLE_DEVICES"] = mask
        parsed = tc._parse_visible_devices()
        if parsed and isinstance(parsed[0], str):
            ordinals = None if parsed[0].startswith("MIG-") else tc._transform_uuid_to_ordinals(parsed, UUIDS)
        else:  # _device_count_nvml: the list up to the first index past the machine's GPUs
            ordinals = next((parsed[:i] for i, v in enumerate(parsed) if v >= len(UUIDS)), parsed)
        cases.append({"mask": mask, "parsed": [str(x) for x in parsed], "ordinals": ordinals})
    OUT.write_text(json.dumps({"torch": torch.__version__, "uuids": UUIDS, "cases": cases}, indent=1) + "\n")
    print(f"{len(cases)} masks -> {OUT}")


if __name__ == "__main__":
    main()
