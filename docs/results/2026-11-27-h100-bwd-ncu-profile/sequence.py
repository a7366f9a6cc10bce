import csv,sys
d=sys.argv[1]
rows=list(csv.reader(open(f'sass_{d}.csv')))
hdr=rows[1]; data=rows[2:]
ix={h:i for i,h in enumerate(hdr)}
stall=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
allsamp=sum(int(r[ix['Warp Stall Sampling (All Samples)']] or 0) for r in data)
acc=0
for r in data:
    n=int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    src=r[ix['Source']]
    ex=r[ix['Instructions Executed']]
    key=any(k in src for k in ('HGMMA','BAR','DEPBAR','SYNCS','FENCE','UBLK','UTMA','BRA','EXIT','WARPGROUP.ARRIVE'))
    acc+=n
    if n/allsamp>0.003 or key:
        reasons=sorted(((int(r[ix[s]] or 0),s[6:]) for s in stall),reverse=True)[:2]
        print(f"{r[ix['Address']][-4:]} {100*n/allsamp:5.1f}% cum{100*acc/allsamp:5.1f} ex{ex:>9} {src[:58]:58} {' '.join(f'{b}:{a}' for a,b in reasons if a)}")
