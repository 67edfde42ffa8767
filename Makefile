# `make run` and `make test` each set up a fresh machine first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
REPORTS := out/ci-reports

.PHONY: setup run test reports
setup:
	@scripts/setup.sh

run: setup
	$(PY) scripts/export_model.py bart

# The test suite (both reduction paths: the adapter's subgroups, which it must find, see
# tests/conftest.py, and the workgroup memory an adapter without them uses), then the
# coverage audit and accuracy report on the smallest variant of each model, and on an
# exported file run back from disk, then whisper tiny exported with XNNPACK and run in
# ExecuTorch's runtime under its rule (against the same export without our delegate; an
# ETDump of its runs beside the reports): their verdicts gate like tests do (exit status 1
# when one fails).
test: setup
	PIPELINE_REQUIRE_GPU=1 $(PY) -m pytest -q
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
