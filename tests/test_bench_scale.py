"""bench_scale reports the median of its speed runs, with the lowest and the highest beside it: one
run on a shared machine moves by +-20%, and a target judged on one run would be judged on noise."""
from __future__ import annotations

import json

from benchmarks import bench_scale


def test_the_median_of_three_speed_runs_is_reported_with_the_spread(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # bench-results/ is written in the working folder
    bench_scale.main(["--ranks", "5", "--workers", "2", "--items", "300", "--memory-items", "300", "--rounds", "3"])
    figures = json.loads((tmp_path / "bench-results" / "bench_scale.json").read_text())
    speed, memory = figures["speed"], figures["memory"]
    rounds = speed["rounds_results_per_second"]
    assert len(rounds) == 3 and speed["results_per_second"] == sorted(rounds)[1]
    assert speed["items"] == 300 and memory["items"] == 300 and memory["bytes_per_item"] > 0
    table = capsys.readouterr().out
    assert f"median of 3 runs; lowest {min(rounds):,.0f}, highest {max(rounds):,.0f}" in table
    assert f"**{speed['results_per_second']:,.0f}**" in table


def test_the_median_of_an_even_count_is_the_lower_middle():
    rounds = [{"results_per_second": value} for value in (3.0, 1.0, 4.0, 2.0)]
    assert bench_scale.median_round(rounds)["results_per_second"] == 2.0
    assert bench_scale.median_round(rounds)["rounds_results_per_second"] == [3.0, 1.0, 4.0, 2.0]
