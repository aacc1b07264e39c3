"""Sums the outcomes of bench/seeds/run.sh by tier, over all its runs and by scenario:
requests on time (TTFT within the tier's target), on time among feasible ones (those an idle
engine puts on time), and late completions (first token after 2x the target, or 2x the
request's idle prefill if longer), the load driver's definitions.
    python3 bench/seeds/sum.py TAG [TAG...]"""
import json,glob,collections,sys
tgt={'premium':500,'standard':1500,'free':5000}
for tag in sys.argv[1:]:
    tot=collections.Counter()
    per=collections.defaultdict(collections.Counter)
    for f in sorted(glob.glob(f'/tmp/seeds/{tag}/*/results.json')):
        scen=f.split('/')[-2].rsplit('-',1)[0]
        for run in json.load(open(f))['runs']:
            for x in run['request_samples']:
                if x['arrival_s']<run['measure_from_s']: continue
                comp=x['outcome']=='completed'
                ok=comp and x['ttft_ms']<=tgt[x['tier']]
                late=comp and x['ttft_ms']>max(2*tgt[x['tier']],2*x['idle_ttft_ms'])
                feas=x['idle_ttft_ms']<=tgt[x['tier']]
                for c in (tot, per[scen]):
                    c[x['tier']+'_n']+=1
                    c[x['tier']+'_ok']+=ok
                    c[x['tier']+'_late']+=late
                    c[x['tier']+'_comp']+=comp
                    if feas: c[x['tier']+'_feas']+=1; c[x['tier']+'_feasok']+=ok
    def line(c): return ' '.join(f"{t}: ok {c[t+'_ok']} feas-ok {c[t+'_feasok']}/{c[t+'_feas']} late {c[t+'_late']}/{c[t+'_comp']}" for t in ['premium','standard','free'])
    print(tag, 'TOTAL', line(tot))
    for s in sorted(per): print('   ', s.ljust(24), line(per[s]))
