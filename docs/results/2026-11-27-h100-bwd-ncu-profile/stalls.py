import csv,sys,collections
d=sys.argv[1]
rows=list(csv.reader(open(f'sass_{d}.csv')))
hdr=rows[1]; data=rows[2:]
ix={h:i for i,h in enumerate(hdr)}
stall=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot=collections.Counter()
allsamp=0
for r in data:
    for s in stall:
        try: v=int(r[ix[s]] or 0)
        except: v=0
        tot[s]+=v
    allsamp+=int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
print('total samples',allsamp)
for s,v in tot.most_common(): print(f'  {s:28} {v:8} {100*v/allsamp:5.1f}%')
# top instructions
top=sorted(data,key=lambda r:-int(r[ix['Warp Stall Sampling (All Samples)']] or 0))[:int(sys.argv[2]) if len(sys.argv)>2 else 40]
for r in top:
    n=int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    reasons=sorted(((int(r[ix[s]] or 0),s[6:]) for s in stall),reverse=True)[:3]
    print(f"{r[ix['Address']]:>6} {100*n/allsamp:5.1f}% {r[ix['Source']][:60]:60} {' '.join(f'{b}:{a}' for a,b in reasons if a)}")
