// The deployment invariants of deploy/kubernetes, checked on rendered manifests.
//
// checkRender(objects, expect) returns every violation as a string ([] = all hold).
// `expect` says what the kustomization is: {form: 'sidecar' | 'daemonset' | 'monitoring',
// backend: 'host' | 'cuda', overlay: true when images must be set, redis: true with the
// Redis tier}. `image` gives what
// deploy/Dockerfile promises: {uid, bin: {kvarenad, kvarena}} (the user the image runs as
// and where it installs the two binaries).
'use strict';

const kDaemon = 'kvarenad';
// The DaemonSet's one root step: it may run as root with CAP_CHOWN, nothing else.
const kSocketDirInit = 'socket-dir';

// "1Gi" / "512Mi" / "8G" / "1000": bytes, as kvarenad's --arena_bytes and Kubernetes
// memory quantities spell them; NaN when it is neither.
function parseBytes(text) {
  const m = /^(\d+)(Ki|Mi|Gi|Ti|K|M|G|T|k)?$/.exec(String(text));
  if (!m) return NaN;
  const unit = {undefined: 1, K: 1e3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 2 ** 10, Mi: 2 ** 20,
                Gi: 2 ** 30, Ti: 2 ** 40}[m[2]];
  return Number(m[1]) * unit;
}

// "2" / "500m": CPUs.
function parseCpu(text) {
  const m = /^(\d+(?:\.\d+)?)(m)?$/.exec(String(text));
  return m ? Number(m[1]) / (m[2] ? 1000 : 1) : NaN;
}

// --name=value args as a Map; a repeated or malformed arg is reported.
function parseArgs(args, at, errors) {
  const flags = new Map();
  for (const a of args || []) {
    const m = /^--([a-z_]+)=(.*)$/.exec(a);
    if (!m) {
      errors.push(`${at}: arg "${a}" is not --name=value`);
    } else if (flags.has(m[1])) {
      errors.push(`${at}: --${m[1]} is given twice`);
    } else {
      flags.set(m[1], m[2]);
    }
  }
  return flags;
}

function podTemplates(objects) {
  return objects.filter((o) => o.kind === 'Deployment' || o.kind === 'DaemonSet').map((o) => ({
    owner: `${o.kind}/${o.metadata.name}`, kind: o.kind, template: o.spec.template}));
}

function allContainers(spec) {
  return [...(spec.initContainers || []).map((c) => ({c, init: true})),
          ...(spec.containers || []).map((c) => ({c, init: false}))];
}

// Restricted-style hardening of one container (pod-level settings count where the
// container leaves them unset).
function checkSecurity(pod, c, at, errors) {
  const sc = c.securityContext || {};
  const psc = pod.securityContext || {};
  const rootStep = c.name === kSocketDirInit;
  if (sc.privileged === true) errors.push(`${at}: privileged`);
  if (sc.allowPrivilegeEscalation !== false) errors.push(`${at}: allowPrivilegeEscalation must be false`);
  if (sc.readOnlyRootFilesystem !== true) errors.push(`${at}: readOnlyRootFilesystem must be true`);
  const drop = (sc.capabilities && sc.capabilities.drop) || [];
  if (!drop.includes('ALL')) errors.push(`${at}: capabilities.drop must include ALL`);
  const add = (sc.capabilities && sc.capabilities.add) || [];
  const allowedAdd = rootStep ? ['CHOWN'] : [];
  for (const cap of add) {
    if (!allowedAdd.includes(cap)) errors.push(`${at}: capability ${cap} added`);
  }
  const seccomp = (sc.seccompProfile || psc.seccompProfile || {}).type;
  if (seccomp !== 'RuntimeDefault') errors.push(`${at}: seccompProfile must be RuntimeDefault`);
  const nonRoot = sc.runAsNonRoot !== undefined ? sc.runAsNonRoot : psc.runAsNonRoot;
  const uid = sc.runAsUser !== undefined ? sc.runAsUser : psc.runAsUser;
  if (rootStep) {
    if (!(pod.initContainers || []).includes(c)) errors.push(`${at}: ${kSocketDirInit} must be an init container`);
    return;
  }
  if (nonRoot !== true) errors.push(`${at}: runAsNonRoot must be true`);
  if (uid === undefined || uid === 0) errors.push(`${at}: runAsUser must be set and not 0`);
}

// kvarenad's probes ask grpc.health.v1.Health/Check for the server's status, the only way
// they can: an exec of the image's CLI, `kvarena --address=<its Unix socket> --timeout=Ns
// health`. A grpc:, httpGet or tcpSocket probe would need a TCP port, and kvarenad's only one
// serves metrics, which answers while the daemon is NOT_SERVING.
function checkProbes(c, flags, bin, at, errors) {
  const unix = (flags.get('listen') || '').split(',').find((a) => a.startsWith('unix:'));
  for (const name of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    const p = c[name];
    if (!p) {
      errors.push(`${at}: no ${name}`);
      continue;
    }
    const handlers = ['exec', 'grpc', 'httpGet', 'tcpSocket'].filter((h) => p[h]);
    if (handlers.length !== 1 || handlers[0] !== 'exec') {
      errors.push(`${at}: ${name} has ${handlers.join(' + ') || 'no'} handler; kvarenad has no TCP health port, so ` +
                  `its probes are exactly one exec of \`${bin.kvarena} ... health\``);
      continue;
    }
    const cmd = p.exec.command || [];
    if (cmd[0] !== bin.kvarena || cmd[cmd.length - 1] !== 'health') {
      errors.push(`${at}: ${name} must run \`${bin.kvarena} ... health\` (found ${JSON.stringify(cmd)})`);
      continue;
    }
    const other = cmd.slice(1, -1).filter((a) => !/^--(address|timeout)=/.test(a));
    if (other.length) {
      errors.push(`${at}: ${name} passes ${other.join(' ')}; the health check takes only --address and --timeout ` +
                  '(the server\'s status, not one service\'s)');
    }
    if (!cmd.includes(`--address=${unix}`)) {
      errors.push(`${at}: ${name} does not check kvarenad's socket ${unix}`);
    }
    const timeout = cmd.map((a) => /^--timeout=(\d+)s$/.exec(a)).find(Boolean);
    if (!timeout || !(Number(timeout[1]) < (p.timeoutSeconds || 1))) {
      errors.push(`${at}: ${name} needs --timeout=Ns below its timeoutSeconds`);
    }
  }
}

// kvarenad's container: flags, probes, metrics, resources, access.
function checkDaemon(t, c, expect, image, errors) {
  const at = `${t.owner} ${c.name}`;
  const pod = t.template.spec;
  const flags = parseArgs(c.args, at, errors);
  if (JSON.stringify(c.command) !== JSON.stringify([image.bin.kvarenad])) {
    errors.push(`${at}: command must be [${image.bin.kvarenad}]`);
  }
  const uid = (c.securityContext || {}).runAsUser;
  if (uid !== image.uid) errors.push(`${at}: runAsUser ${uid}, but the image's user is ${image.uid}`);

  const backend = flags.get('backend');
  if (backend !== expect.backend) errors.push(`${at}: --backend=${backend}, expected ${expect.backend}`);
  const listen = (flags.get('listen') || '').split(',');
  if (!listen[0] || listen.some((a) => !a.startsWith('unix:'))) {
    errors.push(`${at}: --listen must be Unix sockets only (no TCP listener), found ${listen}`);
  }
  const threads = Number(flags.get('num_threads'));
  const cpu = parseCpu(((c.resources || {}).requests || {}).cpu);
  // --num_threads counts the kernel workers besides the thread serving the call: with it
  // they must fit the CPU request (the default, -1, counts the node's cores).
  if (!(threads >= 0 && threads + 1 <= Math.ceil(cpu))) {
    errors.push(`${at}: --num_threads=${flags.get('num_threads')} must be set, >= 0 and at most the CPU request ${cpu} less the serving thread`);
  }
  checkProbes(c, flags, image.bin, at, errors);

  // Metrics: the flag, the named port and the scrape annotations agree.
  const port = Number(flags.get('metrics_port'));
  const named = (c.ports || []).find((p) => p.name === 'metrics');
  if (!named || named.containerPort !== port) errors.push(`${at}: port "metrics" must be --metrics_port=${port}`);
  if (flags.get('metrics_address') !== '0.0.0.0') errors.push(`${at}: --metrics_address must be 0.0.0.0 to be scraped`);
  const ann = t.template.metadata.annotations || {};
  if (ann['prometheus.io/scrape'] !== 'true' || ann['prometheus.io/port'] !== String(port) ||
      ann['prometheus.io/path'] !== '/metrics') {
    errors.push(`${t.owner}: prometheus.io/scrape, port, path must be "true", "${port}", "/metrics"`);
  }

  // Resources: a host arena is memory charged to this container; a CUDA one needs a GPU.
  const limits = (c.resources || {}).limits || {};
  const arena = parseBytes(flags.get('arena_bytes'));
  if (!(arena > 0)) errors.push(`${at}: --arena_bytes must be set`);
  if (backend === 'host' && !(parseBytes(limits.memory) >= arena + 256 * 2 ** 20)) {
    errors.push(`${at}: memory limit ${limits.memory} must cover --arena_bytes=${flags.get('arena_bytes')} + 256Mi`);
  }
  const gpus = Number(limits['nvidia.com/gpu'] || 0);
  if (backend === 'cuda' && !(gpus >= 1)) errors.push(`${at}: --backend=cuda needs limits nvidia.com/gpu >= 1`);
  if (backend !== 'cuda' && gpus !== 0) errors.push(`${at}: a GPU requested for --backend=${backend}`);

  // Access: sockets 0660 in a group every worker of the pod (or node) is in.
  if (flags.get('socket_mode') !== '0660') errors.push(`${at}: --socket_mode must be 0660`);
  const group = Number(flags.get('socket_group'));
  if (!(pod.securityContext.supplementalGroups || []).includes(group)) {
    errors.push(`${at}: --socket_group=${flags.get('socket_group')} is not in the pod's supplementalGroups`);
  }
  const socketDir = listen[0].replace(/^unix:/, '').replace(/\/[^/]+$/, '');
  const mount = (c.volumeMounts || []).find((m) => m.mountPath === socketDir);
  if (!mount || mount.readOnly) errors.push(`${at}: no writable volume mounted at the socket directory ${socketDir}`);
  return {flags, uid, group, socketDir, volume: mount && pod.volumes.find((v) => v.name === mount.name),
          allowed: (flags.get('allowed_uids') || '').split(',').filter(Boolean).map(Number)};
}

// A worker container can reach the daemon: the socket directory mounted (read-only is
// enough), the sockets' group, a uid the fd socket allows, the address in its env.
function checkWorker(t, c, d, errors) {
  const at = `${t.owner} ${c.name}`;
  const pod = t.template.spec;
  const mount = (c.volumeMounts || []).find((m) => m.mountPath === d.socketDir);
  const volume = mount && pod.volumes.find((v) => v.name === mount.name);
  // In kvarenad's pod: the same volume; in another pod: the same host directory.
  const same = volume && (d.volume.hostPath ? volume.hostPath && volume.hostPath.path === d.volume.hostPath.path
                                            : volume === d.volume);
  if (!volume) {
    errors.push(`${at}: does not mount the socket directory ${d.socketDir}`);
  } else if (!same) {
    errors.push(`${at}: mounts another volume than kvarenad's socket directory`);
  }
  if (mount && mount.readOnly !== true) errors.push(`${at}: the socket directory should be mounted readOnly`);
  if (!(pod.securityContext.supplementalGroups || []).includes(d.group)) {
    errors.push(`${at}: not in the sockets' group ${d.group}`);
  }
  const uid = (c.securityContext || {}).runAsUser;
  if (uid !== d.uid && !d.allowed.includes(uid)) {
    errors.push(`${at}: uid ${uid} may not fetch fds (--allowed_uids=${d.allowed.join(',')})`);
  }
  const env = (c.env || []).find((e) => e.name === 'KVARENA_ADDRESS');
  if (!env || env.value !== d.flags.get('listen').split(',')[0]) {
    errors.push(`${at}: KVARENA_ADDRESS must be kvarenad's --listen address`);
  }
}

function checkSidecar(templates, expect, image, errors) {
  const ts = templates.filter((t) => t.kind === 'Deployment');
  if (ts.length !== 1 || templates.length !== 1) errors.push(`the sidecar form renders exactly one Deployment`);
  for (const t of ts) {
    const pod = t.template.spec;
    const inits = pod.initContainers || [];
    const d = inits.find((c) => c.name === kDaemon);
    if (!d) {
      errors.push(`${t.owner}: no ${kDaemon} init container`);
      continue;
    }
    if (inits[0] !== d) errors.push(`${t.owner}: ${kDaemon} must be the first init container`);
    if (d.restartPolicy !== 'Always') {
      errors.push(`${t.owner} ${kDaemon}: restartPolicy must be Always (a native sidecar)`);
    }
    if ((pod.containers || []).some((c) => c.name === kDaemon)) errors.push(`${t.owner}: ${kDaemon} in containers`);
    for (const v of pod.volumes || []) {
      if (v.hostPath) errors.push(`${t.owner}: hostPath volume ${v.name} in the sidecar form`);
    }
    const info = checkDaemon(t, d, expect, image, errors);
    if (info.volume && !info.volume.emptyDir) errors.push(`${t.owner}: the socket directory must be an emptyDir`);
    for (const c of pod.containers || []) checkWorker(t, c, info, errors);
  }
}

function checkDaemonSet(templates, expect, image, errors) {
  const ds = templates.filter((t) => t.kind === 'DaemonSet');
  if (ds.length !== 1) errors.push('the DaemonSet form renders exactly one DaemonSet');
  for (const t of ds) {
    const pod = t.template.spec;
    const d = (pod.containers || []).find((c) => c.name === kDaemon);
    if (!d) {
      errors.push(`${t.owner}: no ${kDaemon} container`);
      continue;
    }
    const info = checkDaemon(t, d, expect, image, errors);
    if (!info.volume || !info.volume.hostPath) {
      errors.push(`${t.owner}: the socket directory must be a hostPath`);
      continue;
    }
    const init = (pod.initContainers || []).find((c) => c.name === kSocketDirInit);
    const chown = ['chown', `${info.uid}:${info.group}`, info.socketDir];
    if (!init || JSON.stringify(init.command) !== JSON.stringify(chown)) {
      errors.push(`${t.owner}: init container ${kSocketDirInit} must run ${chown.join(' ')}`);
    }
    for (const w of templates.filter((x) => x.kind === 'Deployment')) {
      for (const c of w.template.spec.containers) checkWorker(w, c, info, errors);
    }
  }
}

// With the Redis tier (expect.redis): kvarenad has seeds and reads its password from a file
// of a Secret volume mounted read-only into kvarenad's container and no other; no password
// on the command line (docs/redis-tier.md).
function checkRedisTier(templates, errors) {
  for (const t of templates) {
    const pod = t.template.spec;
    const daemon = allContainers(pod).find(({c}) => c.name === kDaemon);
    if (!daemon) continue;
    const at = `${t.owner} ${kDaemon}`;
    const flags = parseArgs(daemon.c.args, at, []);
    if (!flags.get('tier_redis')) errors.push(`${at}: no --tier_redis seeds`);
    if (flags.has('tier_redis_password')) errors.push(`${at}: a Redis password on the command line`);
    const file = flags.get('tier_redis_password_file') || '';
    const mountOf = (c) => (c.volumeMounts || []).find((m) => file.startsWith(`${m.mountPath}/`));
    const mount = mountOf(daemon.c);
    const volume = mount && (pod.volumes || []).find((v) => v.name === mount.name);
    if (!volume || !volume.secret || !mount.readOnly) {
      errors.push(`${at}: --tier_redis_password_file must be in a Secret volume mounted read-only`);
      continue;
    }
    for (const {c} of allContainers(pod)) {
      if (c !== daemon.c && (c.volumeMounts || []).some((m) => m.name === mount.name)) {
        errors.push(`${t.owner} ${c.name}: mounts the Redis password Secret meant for kvarenad alone`);
      }
    }
  }
}

function checkRender(objects, expect, image) {
  const errors = [];
  const templates = podTemplates(objects);
  for (const t of templates) {
    const pod = t.template.spec;
    for (const f of ['hostIPC', 'hostPID', 'hostNetwork']) {
      if (pod[f]) errors.push(`${t.owner}: ${f}`);
    }
    if (pod.automountServiceAccountToken !== false) errors.push(`${t.owner}: automountServiceAccountToken must be false`);
    for (const {c} of allContainers(pod)) {
      checkSecurity(pod, c, `${t.owner} ${c.name}`, errors);
      if (expect.overlay && !String(c.image).includes('/')) {
        errors.push(`${t.owner} ${c.name}: image "${c.image}" was not set by the kustomization`);
      }
    }
  }
  if (expect.form === 'sidecar') checkSidecar(templates, expect, image, errors);
  if (expect.form === 'daemonset') checkDaemonSet(templates, expect, image, errors);
  if (expect.redis) checkRedisTier(templates, errors);
  // A metrics Service selects the daemon's pods and targets its "metrics" port.
  for (const s of objects.filter((o) => o.kind === 'Service')) {
    const port = (s.spec.ports || []).find((p) => p.name === 'metrics');
    const match = templates.find((t) => Object.entries(s.spec.selector || {}).every(
        ([k, v]) => (t.template.metadata.labels || {})[k] === v));
    if (!port || port.targetPort !== 'metrics' || !match) {
      errors.push(`Service/${s.metadata.name}: must select a pod template and target its "metrics" port`);
    }
  }
  return errors;
}

// The ServiceMonitor selects every metrics Service of the other renders, by a port they have.
function checkMonitoring(monitors, services) {
  const errors = [];
  if (monitors.length === 0) errors.push('no ServiceMonitor');
  for (const m of monitors) {
    for (const s of services) {
      const labels = s.metadata.labels || {};
      const selected = Object.entries(m.spec.selector.matchLabels || {}).every(([k, v]) => labels[k] === v);
      if (!selected) errors.push(`ServiceMonitor/${m.metadata.name} does not select Service/${s.metadata.name}`);
      for (const e of m.spec.endpoints) {
        if (!(s.spec.ports || []).some((p) => p.name === e.port)) {
          errors.push(`ServiceMonitor/${m.metadata.name}: Service/${s.metadata.name} has no port ${e.port}`);
        }
      }
    }
  }
  return errors;
}

module.exports = {checkRender, checkMonitoring, parseBytes, parseArgs};
