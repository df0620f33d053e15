"""Schema checks, thresholds, the report and the CLI surface of ingest; no Spark session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import types as T

from feature_store import sample
from feature_store.cli import build_parser
from feature_store.errors import RequestError
from feature_store.ingest.generate import sample_schema
from feature_store.ingest.report import IngestReport, Outcome, Thresholds
from feature_store.ingest.schema import plan_columns
from feature_store.ingest.spec import RetrySpec, Source
from feature_store.registry import FeatureGroup


def _group() -> FeatureGroup:
    return sample.registry().group(sample.GROUP)


def _with(schema: T.StructType, **changes: T.DataType | None) -> T.StructType:
    fields = [
        T.StructField(f.name, changes.get(f.name, f.dataType) or T.NullType())
        for f in schema.fields
        if not (f.name in changes and changes[f.name] is None)
    ]
    return T.StructType(fields)


def test_the_generated_sample_schema_matches_the_registry() -> None:
    plan = plan_columns(sample_schema(), _group(), "consumer_id")
    assert [c.feature for c in plan.columns] == [f.name for f in _group().features]
    assert all(c.source is Source.NATIVE for c in plan.columns)
    assert plan.input_columns[0] == "consumer_id"


def test_a_type_mismatch_names_the_column() -> None:
    schema = _with(sample_schema(), int_3=T.ArrayType(T.FloatType()), embedding_0=T.LongType())
    with pytest.raises(RequestError) as info:
        plan_columns(schema, _group(), "consumer_id")
    text = str(info.value)
    assert "column 'int_3' has type array<float> but feature 'int_3' is int" in text
    assert "column 'embedding_0' has type bigint but feature 'embedding_0' is embedding(32)" in text
    assert "nothing was written" in text


def test_string_columns_are_parsed_and_other_numeric_types_accepted() -> None:
    schema = _with(
        sample_schema(),
        float_00=T.StringType(),
        float_01=T.DoubleType(),
        float_02=T.IntegerType(),
        int_0=T.StringType(),
        int_list_0=T.StringType(),
        embedding_1=T.ArrayType(T.DoubleType()),
        consumer_id=T.StringType(),
    )
    plan = plan_columns(schema, _group(), "consumer_id")
    sources = {c.feature: c.source for c in plan.columns}
    assert sources["float_00"] is Source.TEXT
    assert sources["float_01"] is Source.NATIVE
    assert sources["int_0"] is Source.TEXT
    assert sources["int_list_0"] is Source.TEXT
    assert sources["embedding_1"] is Source.NATIVE
    assert plan.id_source is Source.TEXT


def test_ids_of_the_wrong_type_are_refused() -> None:
    schema = _with(sample_schema(), consumer_id=T.DoubleType())
    with pytest.raises(RequestError, match="id column 'consumer_id' has type double"):
        plan_columns(schema, _group(), "consumer_id")
    with pytest.raises(RequestError, match="no id column 'uid'"):
        plan_columns(sample_schema(), _group(), "uid")


def test_mapping_renames_columns() -> None:
    schema = T.StructType(
        [
            T.StructField("uid", T.LongType()),
            T.StructField("score", T.FloatType()),
            *[f for f in sample_schema().fields if f.name not in ("consumer_id", "float_07")],
        ]
    )
    plan = plan_columns(schema, _group(), "uid", {"score": "float_07"})
    assert {c.column: c.feature for c in plan.columns}["score"] == "float_07"


def test_mapping_errors_are_all_reported() -> None:
    with pytest.raises(RequestError) as info:
        plan_columns(
            sample_schema(),
            _group(),
            "consumer_id",
            {"nope": "float_00", "float_01": "no_such_feature", "float_02": "float_03"},
        )
    text = str(info.value)
    assert "the input has no column 'nope'" in text
    assert "has no feature 'no_such_feature'" in text
    assert "'float_03' and mapped column 'float_02' both feed feature 'float_03'" in text


def test_missing_features_and_extra_columns() -> None:
    schema = _with(sample_schema(), float_05=None)
    with pytest.raises(RequestError, match=r"no column for feature\(s\) 'float_05'"):
        plan_columns(schema, _group(), "consumer_id")
    plan = plan_columns(schema, _group(), "consumer_id", allow_missing=True)
    assert "float_05" not in {c.feature for c in plan.columns}

    extra = T.StructType([*sample_schema().fields, T.StructField("ds", T.StringType())])
    with pytest.raises(RequestError, match="column 'ds' is not a feature"):
        plan_columns(extra, _group(), "consumer_id")
    assert plan_columns(extra, _group(), "consumer_id", ignore_extra=True).ignored == ("ds",)

    reserved = T.StructType([*sample_schema().fields, T.StructField("_ingest_x", T.StringType())])
    with pytest.raises(RequestError, match="reserved prefix"):
        plan_columns(reserved, _group(), "consumer_id")
    # a quarantine (input columns + _ingest_reason/_detail) can be ingested again
    assert plan_columns(reserved, _group(), "consumer_id", ignore_extra=True).ignored == (
        "_ingest_x",
    )


def test_thresholds() -> None:
    assert Thresholds().exceeded(0, 100) is None
    assert "--max-bad-rows 0" in (Thresholds().exceeded(1, 100) or "")
    assert Thresholds(None, 0.1).exceeded(10, 100) is None
    assert "--max-bad-fraction" in (Thresholds(None, 0.1).exceeded(11, 100) or "")
    assert Thresholds(5, 0.5).exceeded(6, 1000) is not None
    assert Thresholds(None, None).exceeded(10**6, 10**6) is None


def test_retry_bound() -> None:
    assert RetrySpec(3, 0.1, 10.0).max_total_wait() == pytest.approx(0.2 + 0.4 + 0.8)
    assert RetrySpec(5, 1.0, 3.0).max_total_wait() == pytest.approx(2 + 3 + 3 + 3 + 3)


def _report(outcome: Outcome) -> IngestReport:
    return IngestReport(
        outcome=outcome,
        group="g",
        input="in",
        target="redis://127.0.0.1:1",
        rows_read=10,
        entities_written=9,
        entities_skipped=4,
        values_written=90,
        values_removed=3,
        bad_rows=1,
        bad_rows_by_reason={"null_id": 1},
        elapsed_seconds=2.0,
        values_per_second=45.0,
        written_at=1,
        written_at_from="given",
        event_time_column="ts",
        ordered=True,
        chunk_size=500,
        chunks=1,
        retries=0,
        tasks=2,
        quarantine="q",
    )


def test_report_json_fields_and_exit_codes(tmp_path: Path) -> None:
    report = _report(Outcome.BAD_ROWS_OVER_THRESHOLD)
    path = tmp_path / "sub" / "report.json"
    report.write(path)
    data = json.loads(path.read_text())
    for key in (
        "rows_read",
        "entities_written",
        "entities_skipped",
        "event_time_column",
        "written_at_from",
        "values_written",
        "values_removed",
        "bad_rows_by_reason",
        "elapsed_seconds",
        "values_per_second",
        "outcome",
    ):
        assert key in data
    assert data["outcome"] == "bad_rows_over_threshold"
    assert report.exit_code == 1
    assert _report(Outcome.SUCCEEDED).exit_code == 0
    assert _report(Outcome.FAILED).exit_code == 2
    assert "null_id" in report.summary()
    assert "entities skipped                 4" in report.summary()


def test_cli_parses_ingest_and_generate_without_importing_spark() -> None:
    code = (
        "import sys; from feature_store.cli import build_parser; p = build_parser(); "
        "a = p.parse_args(['ingest', '--group', 'g', '--input', 'x', '--id-column', 'id', "
        "'--map', 'a=b', '--max-bad-fraction', '0.01']); "
        "assert a.master == 'local[*]' and a.map == ['a=b'] and a.max_bad_rows == 0; "
        "p.parse_args(['generate', '--output', 'o', '--entities', '5']); "
        "assert not [m for m in sys.modules if m.startswith(('pyspark', 'pyarrow'))], 'spark'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_submit_entry_point_keeps_spark_submits_master() -> None:
    from feature_store.ingest.cli import submit_parser

    argv = ["ingest", "--group", "g", "--input", "x", "--id-column", "id"]
    assert submit_parser().parse_args(argv).master is None
    assert build_parser().parse_args(argv).master == "local[*]"
    assert submit_parser().parse_args(["generate", "--output", "o"]).entities == 100_000


def test_training_set_and_log_sink_run_under_spark_submit_too() -> None:
    from feature_store.ingest.cli import submit_parser

    argv = ["training-set", "--labels", "l.csv", "--log", "d", "--output", "o"]
    args = submit_parser().parse_args(argv)
    assert args.master is None
    assert args.time_column == "event_timestamp"
    assert build_parser().parse_args(argv).master == "local[*]"
    sink = ["log-sink", "--topic", "t", "--bootstrap-servers", "k:1", "--output", "o"]
    args = submit_parser().parse_args([*sink, "--checkpoint", "c"])
    assert args.master is None
    assert args.starting_offsets == "earliest"
