import json
import subprocess
import sys

from engine.gpu_packing import _in_order, _units, described, gpus_needed, orders


def test_gpu_fractions_are_placed_device_by_device_not_as_a_sum():
    # 1.8 <= 2, but no device holds two 0.6s
    assert orders([0.6] * 3, 2) == (False, True) and gpus_needed([0.6] * 3) == 3
    # whole GPUs take free devices: a half-used one is no help
    assert orders([1, 1, 0.5], 2)[0] is False and gpus_needed([1, 1, 0.5]) == 3
    assert gpus_needed([0.5] * 4) == 2 and gpus_needed([]) == 0 and gpus_needed([0.25, 0, 1]) == 2


def test_fractions_that_fit_only_in_some_arrival_orders_are_told_apart_from_those_that_fit_in_any():
    # the two 0.3s on one device first leave 0.4 and 1.0: the second 0.7 waits
    assert orders([0.7, 0.7, 0.3, 0.3], 2) == (True, True)
    assert orders([0.4, 0.4, 0.6, 0.6], 2) == (True, True)
    # halves and quarters fill a device in any order
    assert orders([0.5] * 4, 2) == (True, False)
    assert orders([0.25] * 8 + [0.5] * 4, 4) == (True, False)
    assert orders([0.7, 0.7, 0.3, 0.3], 3) == (True, False)


def test_too_many_orders_to_go_through_leave_the_order_question_open_and_still_answer_whether_they_fit(monkeypatch):
    from engine import gpu_packing

    monkeypatch.setattr(gpu_packing, "MAX_STATES", 5)
    assert orders([0.3] * 4 + [0.7] * 4 + [0.15] * 3, 5) == (True, None)
    assert orders([0.6] * 3, 2)[0] is False
    assert described([0.6, 0.25, 0.6, 0]) == "2 x 0.6, 1 x 0.25"


PLACE_ONE_BY_ONE = """
import json, sys, ray
ray.init(num_cpus=1, num_gpus=2, include_dashboard=False, log_to_driver=False)

@ray.remote(num_cpus=0)
class Holder:
    def ready(self):
        return True

results = []
for demands in json.loads(sys.argv[1]):
    holders, placed = [], []
    for demand in demands:  # each placed before the next is created: the arrival order is the list's
        holders.append(Holder.options(num_gpus=demand).remote())
        try:
            placed.append(ray.get(holders[-1].ready.remote(), timeout=6))
        except ray.exceptions.GetTimeoutError:
            placed.append(False)
            break
    results.append(all(placed) and len(placed) == len(demands))
    for holder in holders:
        ray.kill(holder)
    ray.get([ray.remote(num_gpus=2)(lambda: None).remote()], timeout=30)  # every device free again
print(json.dumps(results))
"""


def test_the_placement_model_is_rays_own_on_a_local_ray_with_two_gpus(tmp_path):
    """Ray (logical GPUs, so no device is needed) against the model, one arrival order at a time. The third
    case tells best fit from first fit: first fit puts 0.4 beside the first 0.5 and leaves 0.1 and 0.4."""
    cases = [[0.6, 0.6, 0.6], [0.4, 0.4, 0.6, 0.6], [0.6, 0.6, 0.4, 0.4], [0.5, 0.6, 0.4, 0.5], [0.5, 1, 0.5]]
    out = subprocess.run([sys.executable, "-c", PLACE_ONE_BY_ONE, json.dumps(cases)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    by_ray = json.loads(out.stdout.strip().splitlines()[-1])
    assert by_ray == [_in_order([_units(d) for d in case], 2) for case in cases] == [False, False, True, True, True]
