import sys, hashlib, struct, subprocess
# FLAC-style MD5 of a FLAC file's audio, via `flac -d` WAV output (handles 12/15/20-bit)
wav = subprocess.run(['flac','-d','-s','-c',sys.argv[1]],check=True,capture_output=True).stdout
p=12; fmt=None
while p < len(wav):
    cid, ln = wav[p:p+4], struct.unpack('<I', wav[p+4:p+8])[0]
    if cid==b'fmt ': fmt=wav[p+8:p+8+ln]
    if cid==b'data':  # length may be 0/garbage when flac -d streams to a pipe with unknown total
        data=wav[p+8:p+8+ln] if 0 < ln <= len(wav)-p-8 else wav[p+8:]; break
    p += 8 + ln + (ln&1)
tag,ch,rate,_,align,cbits=struct.unpack('<HHIIHH',fmt[:16])
vbits = struct.unpack('<H',fmt[18:20])[0] if tag==0xFFFE else cbits
bps = int(sys.argv[2]) if len(sys.argv)>2 else vbits
nb=cbits//8; ob=(bps+7)//8; sh=cbits-bps
out=bytearray()
for i in range(0,len(data),nb):
    v=int.from_bytes(data[i:i+nb],'little',signed=(nb>1))
    if nb==1: v-=128
    v>>=sh
    out+=v.to_bytes(ob,'little',signed=True)
print(hashlib.md5(out).hexdigest(), 'container',cbits,'valid',vbits,'bps',bps)
