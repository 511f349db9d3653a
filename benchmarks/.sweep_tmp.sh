set -o pipefail
PYTHONUNBUFFERED=1 timeout 100 bash benchmarks/device_check.sh --budget-s 80 > $OUT/w2.log 2>&1; tail -2 $OUT/w2.log
echo "=== warps=1"
PYTHONUNBUFFERED=1 timeout 70 python3 -c "
import sys, runpy; sys.path.insert(0, '.')
from vllm_hogwild.attention import triton_attention as ta
orig = ta.meta_for
def meta_for(*a, **k):
    p, m = orig(*a, **k)
    p['num_warps'] = 1
    return p, m
ta.meta_for = meta_for
sys.argv = ['device_check', '--budget-s', '55']
runpy.run_path('benchmarks/device_check.py', run_name='__main__')" > $OUT/w1.log 2>&1; tail -2 $OUT/w1.log
for f in w2 w1; do echo "== $f"; grep "^| .*| [0-9,]* | [0-9]* |" $OUT/$f.log | awk -F'|' '{printf "%s N=%s %s %s;", substr($2,1,12), $3, $4, $7}'; echo; done
