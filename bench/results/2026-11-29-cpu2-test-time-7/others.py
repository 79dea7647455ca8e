"""usage: others.py CWD_PREFIX STOPFILE OUT: every 2 s until STOPFILE exists, the CPU time that running processes
spent, split by whether their working folder is under CWD_PREFIX (the run) or not (other work on the machine).
A sampler: processes that start and end between two samples (most compiler runs) are missed."""
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def snapshot() -> dict[int, tuple[float, str, str]]:
    """pid -> (user + system CPU-seconds, working folder, start of the command line)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ")[:80].decode(errors="replace")
            found[int(pid)] = ((int(fields[11]) + int(fields[12])) / TICK, os.readlink(f"/proc/{pid}/cwd"), command)
        except (OSError, IndexError):
            pass
    return found


def main() -> None:
    prefix, stop, out = sys.argv[1:4]
    previous, run, others, commands = snapshot(), 0.0, 0.0, {}
    while not os.path.exists(stop):
        time.sleep(2)
        current = snapshot()
        for pid, (cpu, folder, command) in current.items():
            spent = cpu - previous[pid][0] if pid in previous and pid != os.getpid() else 0.0
            if spent <= 0:
                continue
            if folder.startswith(prefix):
                run += spent
            else:
                others += spent
                commands[command] = commands.get(command, 0.0) + spent
        previous = current
    top = sorted(((round(spent, 1), command) for command, spent in commands.items()), reverse=True)[:8]
    with open(out, "w") as handle:
        json.dump({"mine_cpu_s": round(run, 1), "others_cpu_s": round(others, 1), "others_top": top}, handle, indent=1)


main()
