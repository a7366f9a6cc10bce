import csv, collections, sys
def kernel_rows(f, start_pat):
    rows=list(csv.reader(open(f)))
    out=[]; on=False; hdr=None
    for r in rows:
        if r and r[0]=='Kernel Name':
            on = start_pat in r[1]; hdr=None; continue
        if not on: continue
        if r and r[0]=='Address': hdr=r; continue
        if hdr and len(r)>5: out.append(dict(zip(hdr,r)))
    return out
def summarize(rows):
    ex=collections.Counter(); stall=collections.Counter(); tot=0; st=0
    for d in rows:
        src=d['Source'].strip()
        if src.startswith('@'): src=src.split(None,1)[1]
        op=src.split()[0].split('.')[0] if src else '?'
        n=int(d['Instructions Executed'] or 0); s=int(d['Warp Stall Sampling (All Samples)'] or 0)
        ex[op]+=n; stall[op]+=s; tot+=n; st+=s
    return ex,stall,tot,st
a=summarize(kernel_rows('attnc_sass.csv','hopper_bwd'))
b=summarize(kernel_rows('fa4_sass.csv','bwd_sm90'))
ops=sorted(set(a[0])|set(b[0]), key=lambda o: -(a[0][o]+b[0][o]))
print(f"total executed warp instr: attnc {a[2]/1e6:.1f} M, fa4 {b[2]/1e6:.1f} M; stall samples attnc {a[3]} fa4 {b[3]}")
print("| opcode | attnc (M) | FA4 (M) | attnc stall % | FA4 stall % |")
print("|---|---:|---:|---:|---:|")
for o in ops[:40]:
    print(f"| {o} | {a[0][o]/1e6:.1f} | {b[0][o]/1e6:.1f} | {100*a[1][o]/a[3]:.1f} | {100*b[1][o]/b[3]:.1f} |")
