# `make run` and `make test` each set up a fresh machine first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
REPORTS := out/ci-reports

.PHONY: setup run test reports
setup:
	@scripts/setup.sh

run: setup
	$(PY) scripts/export_model.py bart

# The test suite, the kernel and native call tests again on the workgroup-memory path as an adapter without
# subgroups runs it (the suite itself must find subgroups: tests/conftest.py), then the
# coverage audit and accuracy report on the smallest variant of each model, and on an
# exported file run back from disk, then whisper tiny exported with XNNPACK and run in
# ExecuTorch's runtime under its rule (against the same export without our delegate; an
# ETDump of its runs beside the reports): their verdicts gate like tests do (exit status 1
# when one fails).
test: setup
	PIPELINE_REQUIRE_GPU=1 $(PY) -m pytest -q
	PIPELINE_REQUIRE_GPU=1 PIPELINE_WGPU_SUBGROUPS=0 $(PY) -m pytest -q tests/test_native_layer_norm.py tests/test_native_call.py
	$(MAKE) --no-print-directory reports

reports:
	$(PY) scripts/coverage_audit.py whisper --variant tiny --output-dir $(REPORTS)
	$(PY) scripts/coverage_audit.py bart --output-dir $(REPORTS)
	$(PY) scripts/coverage_audit.py florence2 --output-dir $(REPORTS)
	$(PY) scripts/accuracy_report.py whisper --variant tiny --output-dir $(REPORTS)
	$(PY) scripts/accuracy_report.py bart --output-dir $(REPORTS)
	$(PY) scripts/accuracy_report.py florence2 --output-dir $(REPORTS)
	$(PY) scripts/export_model.py whisper --variant tiny --output-dir $(REPORTS)/artifacts
	$(PY) scripts/run_pte.py $(REPORTS)/artifacts/whisper-tiny.pte
	$(PY) scripts/coverage_audit.py --pte $(REPORTS)/artifacts/whisper-tiny.pte --output-dir $(REPORTS)
	$(PY) scripts/accuracy_report.py --pte $(REPORTS)/artifacts/whisper-tiny.pte --output-dir $(REPORTS)
	PIPELINE_WEBGPU=dawn $(PY) scripts/accuracy_report.py whisper --variant tiny --output-dir $(REPORTS)/dawn
	$(PY) scripts/export_model.py whisper --variant tiny --cpu-backend xnnpack --output-dir $(REPORTS)/artifacts
	$(PY) scripts/run_pte.py $(REPORTS)/artifacts/whisper-tiny-xnnpack.pte --runtime executorch --etdump $(REPORTS)/whisper-tiny-xnnpack.etdp
