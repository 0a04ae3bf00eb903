# quiet.sh -- sourced by the bench scripts: wait for the rest of the machine to go quiet before
# a measurement. The caller sets QUIET_MAX (cores) and QUIET_WAIT (seconds) and defines log().
busy_cores() {  # system-wide busy cores over 1 s, from /proc/stat
  python3 -c 'import os,time
def rd():
    v=[float(x) for x in open("/proc/stat").readline().split()[1:9]]
    return v[0]+v[1]+v[2]+v[5]+v[6]+v[7]
a=rd(); time.sleep(1); print("%.2f" % ((rd()-a)/os.sysconf("SC_CLK_TCK")))'
}
wait_quiet() {  # up to QUIET_WAIT s until the machine uses < QUIET_MAX cores
  local t=0 b
  while :; do
    b=$(busy_cores)
    if awk -v b="$b" -v m="$QUIET_MAX" 'BEGIN{exit !(b<m)}'; then return 0; fi
    t=$((t + 1))
    if [ $t -ge "$QUIET_WAIT" ]; then log "  box busy ($b cores) for ${QUIET_WAIT}s; measuring anyway"; return 0; fi
  done
}
