# stallscope: two commands set up and run everything on a fresh Debian machine.
#   make demo   analyze a shipped sample and write the report
#   make test   install what is needed and run every test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEB_PACKAGES := tshark tcpdump bpftrace nftables iproute2 ethtool gcc chromium elfutils gdb
DEMO_PCAP := tests/fixtures/lab/loss/pcap/rank2.pcap
DEMO_BUNDLE := $(wildcard tests/fixtures/bundles/loss/*.tar.gz)
DEMO_OUT := out/demo
DEMO_SQL := SELECT n.rank, count(*) AS slow_allreduces, sum(r.retransmits) AS retransmits_in_window \
  FROM (SELECT n.timestamp_ns, n.rank, count(t.event) AS retransmits FROM nccl_events n \
        LEFT JOIN tcp_events t ON t.timestamp_ns BETWEEN n.timestamp_ns AND n.timestamp_ns + n.duration_ns \
        AND t.event = 'tcp_retransmit_skb' AND (t.rank = n.rank OR t.peer_rank = n.rank) \
        WHERE n.op = 'ALL_REDUCE' AND n.duration_ns > 50000000 GROUP BY 1, 2) r \
  JOIN nccl_events n USING (timestamp_ns, rank) GROUP BY 1 ORDER BY 3 DESC

.PHONY: all venv debs test demo golden bench fuzz accuracy lab regimes-clean-10 watch-clean-5min watch-unknown-jobs watch-align watch-faults \
  watch-blind lab-matrix \
  image-tag image clean

all: test

$(STAMP): pyproject.toml setup.py $(wildcard forensics/native/*.c forensics/native/*.h)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests drive (tshark is the TCP oracle; elfutils' eu-stack and gdb take
# capture's native stacks of a hung job). Installed only when
# missing and only as root; without root the tests that need them skip and say why.
debs:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "not root: Debian packages$$missing not installed; tests needing them will skip"; fi; \
	fi

test: debs venv
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/stallscope tcp $(DEMO_PCAP) --flows
	$(VENV)/bin/stallscope query $(DEMO_BUNDLE) "$(DEMO_SQL)"
	@# the report of the shipped loss bundle; exit code 1 means "found an error", expected here
	mkdir -p $(DEMO_OUT)
	$(VENV)/bin/stallscope analyze $(DEMO_BUNDLE) -o $(DEMO_OUT)/report.html --json $(DEMO_OUT)/findings.json \
	  --markdown $(DEMO_OUT)/summary.md --perfetto $(DEMO_OUT)/trace.json --force || [ $$? -eq 1 ]
	@echo "open $(DEMO_OUT)/report.html in a browser (offline; ui.perfetto.dev opens $(DEMO_OUT)/trace.json)"

# the shipped bundle sets' JSON, Markdown and Perfetto outputs, kept byte for byte in
# tests/fixtures/golden/ (tests/forensics/test_golden.py): regenerate only for a change meant to alter them
golden: venv
	$(PY) -m tests.golden

# every benchmark (tracer_overhead needs root and bpftrace; it says so and is skipped otherwise;
# fleet: 8-64 synthetic hosts of 1M packets each, ~10 minutes and ~2 GB of /tmp)
bench: debs venv
	$(PY) bench/pcap_throughput.py
	$(PY) bench/analyze.py
	$(PY) bench/fleet.py
	$(PY) bench/logs.py
	if [ "$$(id -u)" = 0 ]; then $(PY) bench/tracer_overhead.py; else echo "bench/tracer_overhead.py: needs root (skipped)"; fi

# the long fuzz run (issue 7): FUZZ_EXAMPLES inputs per target, over FUZZ_JOBS processes;
# inputs that break a contract are shrunk into fuzz-crashes/ (make test runs the CI-sized one)
FUZZ_EXAMPLES ?= 100000
FUZZ_JOBS ?= 2
fuzz: venv
	$(PY) bench/fuzz.py --examples $(FUZZ_EXAMPLES) --jobs $(FUZZ_JOBS) --crash-dir fuzz-crashes $(FUZZ_ARGS)

# issue 44: the randomized fault campaign in the lab (root; ~1 minute a case on 2 cores, 100 cases by
# default: an hour or more); ACCURACY_ARGS="--quick" for 20, "--seed S", "--classes a,b", "--regimes x,y",
# "--plan" to print the cases only; the cases land in out/accuracy.json
ACCURACY_ARGS ?=
accuracy: debs venv
	mkdir -p out
	$(PY) bench/accuracy.py --out out/accuracy.json $(ACCURACY_ARGS)

# make lab SCENARIO=gpu-hang RANK=1 CAPTURE=per-host CAPTURE_START=onset+10 [HOLD_S= CAPTURE_STAGGER_S=
#   CAPTURE_DURATION_S= CAPTURE_ARGS="--no-bpf" STRESS=N TCP=defaults|lab SEED=N ...]: see tests/lab/README.md
lab:
	$(MAKE) -C tests/lab run SCENARIO=$(SCENARIO) RANK=$(RANK) RANKS=$(RANKS) OUT=$(OUT) \
	  CAPTURE=$(CAPTURE) CAPTURE_START=$(CAPTURE_START) CAPTURE_STAGGER_S=$(CAPTURE_STAGGER_S) \
	  CAPTURE_DURATION_S=$(CAPTURE_DURATION_S) CAPTURE_ARGS='$(CAPTURE_ARGS)' STRESS=$(STRESS) TCP=$(TCP) SEED=$(SEED)

# issue 12's check before a submission (root, ~10 minutes): the clean job captured one host at
# a time (starts 0-5 s apart, stopped while it runs, Linux TCP defaults, a CPU hog per host)
# ten times in a row, each without a warning or an error finding
# issue 13's long check (root, ~6 minutes): a clean job watched by capture --watch for five
# minutes writes no bundle, while two hangs injected beside it each get theirs
watch-clean-5min: debs venv
	STALLSCOPE_WATCH_CLEAN_S=300 $(PY) -m pytest -q -p no:cacheprovider tests/capture/test_watch.py -k under_watch

# the watcher before jobs it knows nothing about, the whole matrix (~13 minutes): the first job 30-60 s
# after it, a second from another copy, one in its own mount namespace, one it cannot trace, and a
# clean job for 5 minutes (STALLSCOPE_UNKNOWN_CLEAN_S)
watch-unknown-jobs: debs venv
	STALLSCOPE_UNKNOWN_ALL=1 $(PY) -m pytest -q -p no:cacheprovider tests/lab_runs/test_watch_unknown.py

# the watcher's verdicts against the lab's truth (~5 minutes): a late mismatch (its op number the job's
# own), a link down 3 s in, and two jobs back to back (the bundle and the report are the hung one's)
watch-align: debs venv
	STALLSCOPE_WATCH_ALIGN=1 $(PY) -m pytest -q -p no:cacheprovider tests/lab_runs/test_watch_align.py

# every lab fault, early and late, under a watcher as deployed: a capture's verdict (root; ~30 min)
watch-faults: debs venv
	STALLSCOPE_WATCH_FAULTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/lab_runs/test_watch_faults.py

# the watcher with no blind window, jobs held at their library's mapping (root; minutes)
watch-blind: debs venv
	STALLSCOPE_WATCH_BLIND=1 $(PY) -m pytest -q -p no:cacheprovider tests/lab_runs/test_watch_blind.py

# every lab fault in every regime it applies to (make test runs each class once; root; ~30 minutes)
lab-matrix: debs venv
	STALLSCOPE_LAB_MATRIX=1 $(PY) -m pytest -q -p no:cacheprovider tests/lab_runs/test_new_faults_lab.py \
	  tests/lab_runs/test_init_hang_regimes.py tests/lab_runs/test_watch_checkpoint.py

regimes-clean-10: debs venv
	@ok=0; for i in 1 2 3 4 5 6 7 8 9 10; do \
	  if $(PY) -m pytest -q -p no:cacheprovider tests/lab_runs/test_regimes_findings.py -k 'per_host and clean' \
	       >/tmp/stallscope-clean-$$i.log 2>&1; \
	  then ok=$$((ok+1)); echo "run $$i: passed"; else echo "run $$i: FAILED (/tmp/stallscope-clean-$$i.log)"; fi; \
	done; echo "clean per-host runs: $$ok of 10 passed"; [ $$ok -eq 10 ]

# the watcher's image (deploy/image/Containerfile), tagged with pyproject.toml's version: the
# reference deploy/kubernetes/stallscope-daemonset.yaml names (tests/deploy/test_deploy.py checks it)
image-tag:
	@deploy/image/image.sh tag

image:
	deploy/image/image.sh build

clean:
	rm -rf $(VENV) build *.egg-info forensics/native/*.so
