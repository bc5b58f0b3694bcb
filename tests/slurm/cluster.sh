#!/usr/bin/env bash
# A real one-node SLURM cluster on 127.0.0.1 for the integration tests (Debian bookworm's
# slurm-wlm 22.05 and munge), run as root without systemd or cgroups: daemons started directly.
#   tests/slurm/cluster.sh up | down | status
# Everything SLURM writes lies in $LEHR_SLURM_DIR (default /tmp/lehr-slurm), /etc/slurm is left
# alone: commands find this cluster through SLURM_CONF, which `up` prints as an export to eval.
set -euo pipefail

DIR=${LEHR_SLURM_DIR:-/tmp/lehr-slurm}
export SLURM_CONF=$DIR/slurm.conf
# Not the default ports, so that a SLURM already on the machine (or a stale one) never answers.
CTLD_PORT=16817
SLURMD_PORT=16818

# Progress on stderr: stdout holds only the export line, for eval "$(tests/slurm/cluster.sh up)".
say() { echo "cluster.sh: $*" >&2; }
# The reason, then the tail of the log that holds the real one.
die() {
	echo "cluster.sh: FAILED: $1" >&2
	if [ -n "${2:-}" ] && [ -f "$2" ]; then echo "--- tail of $2:" >&2; tail -n 30 "$2" >&2; fi
	exit 1
}
# A process that exited but is not yet reaped (a zombie) answers kill -0: ps tells them apart.
running() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${s#Z}" = "$s" ]; }
alive() { [ -s "$1" ] && running "$(cat "$1")"; }
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

# SIGTERM, up to 15 s for a clean exit, then SIGKILL: `down` leaves no process behind.
stop() { # name pidfile
	local pid
	if ! alive "$2"; then rm -f "$2"; return 0; fi
	pid=$(cat "$2")
	say "stopping $1 (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 150); do running "$pid" || break; sleep 0.1; done
	if running "$pid"; then
		say "$1 ignored SIGTERM for 15 s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		sleep 0.5
	fi
	rm -f "$2"
}

install_packages() {
	# CI starts from a fresh machine; a developer's machine has them already and skips apt.
	if command -v slurmctld >/dev/null && command -v munged >/dev/null; then return 0; fi
	say "installing slurmctld slurmd slurm-client munge (apt)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		slurmctld slurmd slurm-client munge
}

start_munge() {
	local key=/etc/munge/munge.key
	if [ ! -s $key ]; then
		say "creating $key"
		install -d -o munge -g munge -m 0700 /etc/munge
		mungekey --create --keyfile=$key 2>/dev/null || dd if=/dev/urandom of=$key bs=1024 count=1 status=none
		chown munge:munge $key
		chmod 0400 $key
	fi
	if munge_ok; then say "munged already running"; return 0; fi
	say "starting munged"
	# As its own user: munged refuses to run as root without --force. /run/munge holds its socket.
	install -d -o munge -g munge -m 0755 /run/munge
	runuser -u munge -- munged || die "munged did not start" /var/log/munge/munged.log
	for _ in $(seq 50); do munge_ok && break; sleep 0.2; done
	munge_ok || die "munge -n | unmunge fails" /var/log/munge/munged.log
	# Ours to stop on `down`; a munged that was already running (the machine's) is not.
	cp /run/munge/munged.pid "$DIR/munged.pid"
}

write_conf() {
	local mem_mb
	# Below what slurmd measures (it drains a node that has less than RealMemory).
	mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
	cat >"$SLURM_CONF" <<CONF
# Written by tests/slurm/cluster.sh: rewritten on every \`up\`, edit the script instead.
ClusterName=lehr-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again cred_expire+1 s after it was killed (121 s by default; 5 is the
# floor, 10 leaves a launch credential time to reach slurmd on a loaded machine)...
AuthInfo=cred_expire=10
# ...and then for a scheduling pass that looks at it: the main one every 60 s by default, the
# backfill one only after some job or node update (a node ping, every SlurmdTimeout/3 s).
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
# No cgroups here (containers, CI): processes tracked through /proc, no task confinement or accounting.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# CPUs alone are the consumable resource: two 1-CPU array tasks run side by side.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
ReturnToService=2
KillWait=30
SlurmctldTimeout=60
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
MailProg=/bin/true
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
}

start() { # name command...: once, then until its pid file names a live process
	local name=$1
	shift
	if alive "$DIR/$name.pid"; then say "$name already running"; return 0; fi
	say "starting $name"
	# The daemon writes its pid file a moment after the command returns; a stale one would pass.
	rm -f "$DIR/$name.pid"
	"$@" || die "$name did not start" "$DIR/$name.log"
	for _ in $(seq 200); do alive "$DIR/$name.pid" && return 0; sleep 0.1; done
	die "$name did not stay up" "$DIR/$name.log"
}

up() {
	install_packages
	mkdir -p "$DIR/state" "$DIR/spool"
	start_munge
	write_conf
	say "wrote $SLURM_CONF"
	# -c: a fresh cluster every time, no jobs recovered from an earlier run's state.
	start slurmctld slurmctld -c -f "$SLURM_CONF"
	# -N: the node is `localhost` whatever this machine's hostname.
	start slurmd slurmd -N localhost -f "$SLURM_CONF"
	say "waiting for node localhost to be idle"
	local state=""
	for i in $(seq 120); do
		state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
		case $state in
		idle) say "node localhost idle"; echo "export SLURM_CONF=$SLURM_CONF"; return 0 ;;
		down* | drain*)
			# A node left down by an earlier run (or drained by slurmd's first report) comes back.
			[ $((i % 10)) = 1 ] && scontrol update nodename=localhost state=resume 2>/dev/null || true ;;
		esac
		alive "$DIR/slurmctld.pid" || die "slurmctld exited" "$DIR/slurmctld.log"
		alive "$DIR/slurmd.pid" || die "slurmd exited" "$DIR/slurmd.log"
		sleep 0.5
	done
	sinfo -N -l >&2 || true
	die "node localhost not idle after 60 s (state: ${state:-none})" "$DIR/slurmd.log"
}

# This cluster's slurmstepds (one per job step, outside slurmd): those under our SLURM_CONF.
stepds() {
	local p
	for p in $(pgrep -x slurmstepd || true); do
		grep -qzxF "SLURM_CONF=$SLURM_CONF" "/proc/$p/environ" 2>/dev/null && echo "$p"
	done
	return 0
}
kill_tree() { # children first: a parent killed first would leave its children to init
	local child
	for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
	kill -KILL "$1" 2>/dev/null || true
}

down() {
	local p c
	# Jobs outlive slurmd, and scancel would give them KillWait's 30 s (slurmd's SIGTERM waits for
	# that too): their processes are SIGKILLed here, then their slurmstepds report and exit.
	for p in $(stepds); do
		say "killing the processes of job step $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
		for c in $(pgrep -P "$p" || true); do kill_tree "$c"; done
	done
	for _ in $(seq 50); do [ -z "$(stepds)" ] && break; sleep 0.2; done
	stop slurmd "$DIR/slurmd.pid"
	stop slurmctld "$DIR/slurmctld.pid"
	for p in $(stepds); do say "killing leftover slurmstepd $p"; kill_tree "$p"; done
	stop munged "$DIR/munged.pid"
	say "down"
}

status() {
	local name
	for name in munged slurmctld slurmd; do
		if alive "$DIR/$name.pid"; then say "$name running (pid $(cat "$DIR/$name.pid"))"
		else say "$name not running (from $DIR)"; fi
	done
	alive "$DIR/slurmctld.pid" && sinfo -N -l || true
}

case ${1:-} in
up | down | status) "$1" ;;
*) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
