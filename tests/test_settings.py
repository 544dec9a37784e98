"""Invalid settings are refused before any asset materializes, with a message naming the field."""

import dagster as dg
import pytest

from definitions import build_defs
from resources import CorpusSource, DataRoot
from tokenmill.errors import ConfigError
from tokenmill.settings import validate_run_settings


def launch(demo_source, data, dedup_config: dict):
    defs = build_defs(CorpusSource(path=str(demo_source)), DataRoot(root=str(data)))
    run_config = {"ops": {"dedup_report": {"config": dedup_config}}}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source_batch", ["g1-b000001"])
        result = defs.resolve_job_def("tokenmill_all").execute_in_process(
            run_config=run_config, instance=instance, partition_key="g1-b000001", raise_on_error=False
        )
        failures = [
            e.event_specific_data.error.to_string()
            for e in result.all_events
            if e.event_type == dg.DagsterEventType.RESOURCE_INIT_FAILURE
        ]
        return result, failures


def test_an_unknown_choice_is_refused_at_launch(demo_source, tmp_path):
    with pytest.raises(dg.DagsterInvalidConfigError, match="keep"):
        launch(demo_source, tmp_path / "data", {"keep": "newest"})
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "config, named",
    [
        ({"threshold": 1.5}, "dedup_report.threshold"),
        ({"bands": 20, "rows": 8, "num_perm": 128}, "bands"),
    ],
)
def test_a_bad_bound_or_combination_fails_the_run_before_any_materialization(demo_source, tmp_path, config, named):
    result, failures = launch(demo_source, tmp_path / "data", config)
    assert not result.success
    assert not result.get_asset_materialization_events()
    assert failures and named in failures[0] and "ConfigError" in failures[0]
    assert not (tmp_path / "data" / "raw_records").exists()


def test_every_bad_value_of_a_run_is_reported_at_once():
    run_config = {
        "ops": {"dedup_report": {"config": {"threshold": 1.5}}, "tokenized_bins": {"config": {"val_fraction": 2.0}}}
    }
    with pytest.raises(ConfigError) as error:
        validate_run_settings(run_config)
    assert "dedup_report.threshold" in str(error.value) and "tokenized_bins.val_fraction" in str(error.value)
