#!/usr/bin/env bash
# The checks that need a CUDA device, in one go: the CUDA tests (each explains on the GPU and on
# the CPU in float64 and compares), the JAX tests on JAX's default device (the GPU where jaxlib
# has CUDA), and the GPU benchmarks (benchmarks/run.py --device cuda; benchmarks/compile.py --device cuda
# --mode reduce-overhead: fxlrp.compile as CUDA graphs against the compiled gradient; benchmarks/jax_cost.py;
# benchmarks/faithfulness_speed.py --device cuda: fxlrp.evaluate against Quantus, which the test extra installs).
# Logs go to the folder given as the first argument (default out/gpu). The time limits add up to
# under 10 minutes, one command on a lent device, most important first.
#   bash benchmarks/gpu_checks.sh [OUT] [BATCH]
set -u
out=${1:-out/gpu}
batch=${2:-32}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    $python -c "import platform, torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
torch.cuda.get_device_name(), 'Python', platform.python_version())"
} 2>&1 | tee "$out/machine.txt"
timeout 130 $python -m pytest -q -p no:cacheprovider -rs -k "cuda or gpu or cudnn" tests/integrations/test_cuda.py \
    tests/app/test_dataset_precision.py tests/unit/test_recurrent.py 2>&1 | tee "$out/cuda_tests.txt"
timeout 180 $python benchmarks/run.py --device cuda --batch "$batch" --repeats 7 \
    --models resnet50,vgg16,densenet121,vit_b_16,hf_vit_base 2>&1 | tee "$out/benchmark.txt"
timeout 120 $python -m benchmarks.compile --device cuda --mode reduce-overhead --models resnet50 --batch "$batch" \
    --repeats 5 --threads 8 2>&1 | tee "$out/compiled.txt"
timeout 70 $python benchmarks/faithfulness_speed.py --device cuda --repeats 3 2>&1 | tee "$out/faithfulness_speed.txt"
timeout 45 $python -m pytest -q -p no:cacheprovider tests/integrations/test_jax.py 2>&1 \
    | tee "$out/jax_tests.txt"
timeout 30 $python benchmarks/jax_cost.py --repeats 20 2>&1 | tee "$out/jax_cost.txt"
