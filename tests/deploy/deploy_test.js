// The deploy/ test: renders every kustomization under deploy/kubernetes with `kubectl
// kustomize` and checks what comes out, then runs the real daemon the way the manifests do.
//
//   node deploy_test.js [--kvarenad=PATH --kvarena=PATH]
//
// 1. Every rendered object is valid for kubernetes-models' schema (types, enums, required
//    fields) and declares no field its type lacks (strict_fields.js).
// 2. The deployment invariants hold (invariants.js): the sidecar is an init container with
//    restartPolicy Always, no hostIPC / hostPID / hostNetwork, no hostPath in the sidecar
//    form, probes on kvarenad, hardened securityContexts, a GPU for the CUDA backend, the
//    metrics port, annotations and ServiceMonitor agreeing, sockets reachable by workers.
// 3. Every pod template meets the Pod Security Standards' baseline and restricted controls
//    (pod_security.js), but for the fields pod_security_cases.js lists with their reasons.
// 4. Negative cases: a mutated copy of a render must fail each of those checks (and each
//    Pod Security control); changes the standard allows must pass it.
// 5. deploy/Dockerfile promises what the manifests assume (uid, binary paths).
// 6. With the built binaries: kvarenad starts with each rendered daemon's exact args (paths
//    moved to a temp dir; --socket_group set to this process's gid; --backend=cuda run as
//    host, there being no GPU here; a free metrics port on loopback; the Redis tier's seeds
//    a loopback port nothing listens on, so the daemon must serve with the tier down, and
//    its password file one in the temp dir), each rendered probe
//    command passes against it, the sockets get the mode and group asked for, the metrics
//    path answers, SIGTERM exits 0; an unknown flag makes kvarenad refuse to start;
//    deploy/runtime-packages.sh names the packages of the binaries' libraries.
//
// KUBECTL picks the kubectl (default: the one on PATH). Exits 1 on any failure.
'use strict';

const {execFileSync} = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const YAML = require('yaml');
const {StrictFields, schemaErrors} = require('./strict_fields');
const {checkRender, checkMonitoring, parseArgs} = require('./invariants');
const {freePort, waitExit, startDaemon, run, get} = require('./processes');
const {kControls, podTemplates} = require('./pod_security');
const {kPodSecurityExceptions, podSecurityMutations, podSecurityErrors, podSecurityCase} =
    require('./pod_security_cases');

const kRoot = path.resolve(__dirname, '..', '..');
const kKube = path.join(kRoot, 'deploy', 'kubernetes');
const kKubectl = process.env.KUBECTL || 'kubectl';
// Every kustomization and what it is; a new one must be added here to be tested.
const kKustomizations = {
  'base': {form: 'sidecar', backend: 'host', overlay: false},
  'overlays/cpu': {form: 'sidecar', backend: 'host', overlay: true},
  'overlays/gpu': {form: 'sidecar', backend: 'cuda', overlay: true},
  'daemonset': {form: 'daemonset', backend: 'host', overlay: true},
  'redis-tier/sidecar': {form: 'sidecar', backend: 'host', overlay: true, redis: true},
  'redis-tier/daemonset': {form: 'daemonset', backend: 'host', overlay: true, redis: true},
  'monitoring': {form: 'monitoring'},
};
// Bounds that only guard against a hang; nothing waits for them to pass.
const kStartBoundMs = 30000;
const kExitBoundMs = 30000;

const argv = Object.fromEntries(process.argv.slice(2).map((a) => {
  const m = /^--([a-z_]+)=(.*)$/.exec(a);
  if (!m) throw new Error(`usage: node deploy_test.js [--kvarenad=PATH --kvarena=PATH], not ${a}`);
  return [m[1], m[2]];
}));
const results = [];

function record(name, errors, ms) {
  results.push({name, errors});
  console.log(`${errors.length ? 'not ok' : 'ok'} ${results.length} - ${name}${ms >= 100 ? ` # ${(ms / 1000).toFixed(1)} s` : ''}`);
  for (const e of errors) console.log(`    ${e}`);
}

async function check(name, fn) {
  const start = Date.now();
  let errors;
  try {
    errors = (await fn()) || [];
  } catch (e) {
    errors = [`threw: ${e.stack || e}`];
  }
  record(name, errors, Date.now() - start);
}

const clone = (x) => JSON.parse(JSON.stringify(x));

function kustomizationDirs(dir, out = []) {
  for (const e of fs.readdirSync(dir, {withFileTypes: true})) {
    if (e.isDirectory()) kustomizationDirs(path.join(dir, e.name), out);
    if (e.isFile() && e.name === 'kustomization.yaml') out.push(path.relative(kKube, dir));
  }
  return out.sort();
}

function render(rel) {
  const out = execFileSync(kKubectl, ['kustomize', path.join(kKube, rel)],
                           {encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe']});
  return YAML.parseAllDocuments(out).map((d) => {
    if (d.errors.length) throw new Error(`${rel}: ${d.errors[0].message}`);
    return d.toJS();
  }).filter(Boolean);
}

// What deploy/Dockerfile's final stage promises: its numeric USER and where the
// entrypoint (kvarenad) and the CLI live.
function imageFacts() {
  const text = fs.readFileSync(path.join(kRoot, 'deploy', 'Dockerfile'), 'utf8');
  const final = text.split(/^FROM /m).pop();
  const errors = [];
  const user = /^USER (\d+):(\d+)\s*$/m.exec(final);
  if (!user) errors.push('deploy/Dockerfile: the final stage needs a numeric USER uid:gid (runAsNonRoot can verify only a numeric user)');
  const entry = /^ENTRYPOINT \["([^"]+)"\]/m.exec(final);
  const kvarenad = entry ? entry[1] : '';
  const dir = path.dirname(kvarenad);
  if (path.basename(kvarenad) !== 'kvarenad') errors.push('deploy/Dockerfile: ENTRYPOINT must be kvarenad');
  if (!new RegExp(`install [^\\n]*bin/kvarenad bin/kvarena ${dir}/`).test(final)) {
    errors.push(`deploy/Dockerfile: the final stage must install kvarenad and kvarena into ${dir}/`);
  }
  for (const m of text.matchAll(/\b((?:scripts|deploy)\/[\w./-]+)/g)) {
    if (!fs.existsSync(path.join(kRoot, m[1]))) errors.push(`deploy/Dockerfile: ${m[1]} does not exist`);
  }
  return {uid: user ? Number(user[1]) : NaN, bin: {kvarenad, kvarena: `${dir}/kvarena`}, errors};
}

function daemonContainers(objects) {
  const out = [];
  for (const o of objects.filter((x) => x.kind === 'Deployment' || x.kind === 'DaemonSet')) {
    const spec = o.spec.template.spec;
    for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) {
      if (c.name === 'kvarenad') out.push({owner: o, c});
    }
  }
  return out;
}

// ---- negative cases: each mutation must be reported by the check named ----

function mutations(gpu, daemonset, redis) {
  const dep = () => clone(gpu.find((o) => o.kind === 'Deployment'));
  const ds = () => clone(daemonset.find((o) => o.kind === 'DaemonSet'));
  const pod = (o) => o.spec.template.spec;
  const kv = (o) => pod(o).initContainers[0];
  const sm = {apiVersion: 'monitoring.coreos.com/v1', kind: 'ServiceMonitor', metadata: {name: 'm'},
              spec: {selector: {}, endpoints: [{port: 'metrics', scrapeTimeoutt: '10s'}]}};
  const m = (what, by, expect, make) => ({what, by, expect, make});
  return [
    m('an unknown field (securityContext.runAsNonroot)', 'strict', 'unknown field "runAsNonroot"',
      () => { const o = dep(); kv(o).securityContext.runAsNonroot = true; return o; }),
    m('an unknown field (spec.templte)', 'strict', 'unknown field "templte"',
      () => { const o = dep(); o.spec.templte = o.spec.template; return o; }),
    m('an unknown field in a hostPath volume', 'strict', 'unknown field "typ"',
      () => { const o = ds(); pod(o).volumes[0].hostPath.typ = 'Directory'; return o; }),
    m('an unknown field in a ServiceMonitor endpoint', 'strict', 'unknown field "scrapeTimeoutt"',
      () => sm),
    m('a wrong type (replicas: "1")', 'schema', 'spec.replicas: must be integer',
      () => { const o = dep(); o.spec.replicas = '1'; return o; }),
    m('a wrong type (containerPort: "9464")', 'schema', 'containerPort: must be integer',
      () => { const o = dep(); kv(o).ports[0].containerPort = '9464'; return o; }),
    m('a wrong type (args: a string)', 'schema', 'args: must be array',
      () => { const o = dep(); kv(o).args = '--backend=cuda'; return o; }),
    m('a value outside an enum (imagePullPolicy: Sometimes)', 'schema', 'imagePullPolicy: must be equal to one of',
      () => { const o = dep(); kv(o).imagePullPolicy = 'Sometimes'; return o; }),
    m('the sidecar without restartPolicy Always', 'gpu', 'restartPolicy must be Always',
      () => { const o = dep(); delete kv(o).restartPolicy; return o; }),
    m('hostIPC', 'gpu', 'hostIPC',
      () => { const o = dep(); pod(o).hostIPC = true; return o; }),
    m('a hostPath volume in the sidecar form', 'gpu', 'hostPath volume',
      () => { const o = dep(); pod(o).volumes.push({name: 'h', hostPath: {path: '/run/kvarena'}}); return o; }),
    m('no startupProbe on kvarenad', 'gpu', 'no startupProbe',
      () => { const o = dep(); delete kv(o).startupProbe; return o; }),
    m('a probe of another socket', 'gpu', "does not check kvarenad's socket",
      () => { const o = dep(); kv(o).livenessProbe.exec.command[1] = '--address=unix:/tmp/x.sock'; return o; }),
    m('a grpc: probe (kvarenad has no TCP health port)', 'gpu', 'has grpc handler',
      () => { const o = dep(); kv(o).readinessProbe = {grpc: {port: 50051}, periodSeconds: 5}; return o; }),
    m('a tcpSocket probe of the metrics port', 'gpu', 'has tcpSocket handler',
      () => { const o = dep(); kv(o).livenessProbe = {tcpSocket: {port: 'metrics'}}; return o; }),
    m('an httpGet probe of /metrics', 'gpu', 'has httpGet handler',
      () => { const o = dep(); kv(o).startupProbe = {httpGet: {path: '/metrics', port: 9464}}; return o; }),
    m('an exec probe with a grpc: handler besides', 'gpu', 'has exec + grpc handler',
      () => { const o = dep(); kv(o).livenessProbe.grpc = {port: 50051}; return o; }),
    m('a probe of one service, not the server', 'gpu', 'passes --service=kvarena.v1.KvCacheService',
      () => { const o = dep(); kv(o).readinessProbe.exec.command.splice(3, 0, '--service=kvarena.v1.KvCacheService'); return o; }),
    m('a probe running another command', 'gpu', 'must run `/usr/local/bin/kvarena ... health`',
      () => { const o = dep(); kv(o).startupProbe.exec.command = ['/bin/true']; return o; }),
    m('a writable root filesystem', 'gpu', 'readOnlyRootFilesystem must be true',
      () => { const o = dep(); kv(o).securityContext.readOnlyRootFilesystem = false; return o; }),
    m('capabilities not dropped', 'gpu', 'capabilities.drop must include ALL',
      () => { const o = dep(); pod(o).containers[0].securityContext.capabilities.drop = []; return o; }),
    m('kvarenad as root', 'gpu', 'runAsUser must be set and not 0',
      () => { const o = dep(); kv(o).securityContext.runAsUser = 0; return o; }),
    m('the gpu overlay without nvidia.com/gpu', 'gpu', 'needs limits nvidia.com/gpu',
      () => { const o = dep(); delete kv(o).resources.limits['nvidia.com/gpu']; return o; }),
    m('a TCP listener', 'gpu', 'Unix sockets only',
      () => { const o = dep(); kv(o).args[3] = '--listen=unix:/run/kvarena/kvarena.sock,0.0.0.0:50051'; return o; }),
    m('metrics annotation on another port', 'gpu', 'prometheus.io/scrape, port, path',
      () => { const o = dep(); o.spec.template.metadata.annotations['prometheus.io/port'] = '9465'; return o; }),
    m('a worker outside the sockets\' group', 'gpu', "not in the sockets' group",
      () => { const o = dep(); pod(o).securityContext.supplementalGroups = [10200]; return o; }),
    m('a worker uid the fd socket refuses', 'gpu', 'may not fetch fds',
      () => { const o = dep(); pod(o).containers[0].securityContext.runAsUser = 10003; return o; }),
    m('a DaemonSet whose socket-dir step adds CAP_SYS_ADMIN', 'daemonset', 'capability SYS_ADMIN added',
      () => { const o = ds(); pod(o).initContainers[0].securityContext.capabilities.add.push('SYS_ADMIN'); return o; }),
    m('a DaemonSet whose kvarenad memory limit is below its arena', 'daemonset', 'must cover --arena_bytes',
      () => { const o = ds(); pod(o).containers[0].resources.limits.memory = '8Gi'; return o; }),
    m('a DaemonSet worker mounting another host directory', 'daemonset', "another volume than kvarenad's",
      () => {
        const w = clone(daemonset.find((o) => o.kind === 'Deployment'));
        pod(w).volumes[0].hostPath.path = '/run/elsewhere';
        return [ds(), w];
      }),
    m('the Redis password Secret mounted into the worker too', 'redis-tier/sidecar', 'meant for kvarenad alone',
      () => {
        const o = clone(redis.find((x) => x.kind === 'Deployment'));
        pod(o).containers[0].volumeMounts.push({name: 'redis-password', mountPath: '/etc/r', readOnly: true});
        return o;
      }),
    m('a Redis password on the command line', 'redis-tier/sidecar', 'a Redis password on the command line',
      () => {
        const o = clone(redis.find((x) => x.kind === 'Deployment'));
        kv(o).args.push('--tier_redis_password=secret');
        return o;
      }),
  ];
}

// ---- the real daemon ----

// One rendered kvarenad container run for real: what the kubelet would start and probe.
async function runRendered(owner, c, image, bins) {
  const errors = [];
  const flags = parseArgs(c.args, 'args', errors);
  const socket = flags.get('listen').split(',')[0].replace(/^unix:/, '');
  const socketDir = path.dirname(socket);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvarena-deploy.'));
  const move = (s) => s.split(`${socketDir}/`).join(`${dir}/`);
  const mode = parseInt(flags.get('socket_mode'), 8);
  try {
    let d;
    let port;
    const redisPassword = path.join(dir, 'redis-password');
    fs.writeFileSync(redisPassword, 'not-the-real-one\n', {mode: 0o400});
    for (let attempt = 0; attempt < 3; attempt++) {  // the free port may be taken meanwhile
      port = await freePort();
      const redisPort = await freePort();  // nothing listens: the tier is down, kvarenad serves
      const args = c.args.map((a) => {
        if (a.startsWith('--tier_redis=')) return `--tier_redis=127.0.0.1:${redisPort}`;
        if (a.startsWith('--tier_redis_password_file=')) return `--tier_redis_password_file=${redisPassword}`;
        if (a.startsWith('--socket_group=')) return `--socket_group=${process.getgid()}`;
        if (a === '--backend=cuda') return '--backend=host';
        if (a.startsWith('--metrics_port=')) return `--metrics_port=${port}`;
        if (a.startsWith('--metrics_address=')) return '--metrics_address=127.0.0.1';
        return move(a);
      });
      d = await startDaemon(bins.kvarenad, args, kStartBoundMs);
      if (d.exited === undefined || !/cannot serve metrics/.test(d.log)) break;
    }
    if (d.exited !== undefined) return [`kvarenad did not start (exit ${d.exited}):`, ...d.log.trim().split('\n')];
    for (const name of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
      const cmd = c[name].exec.command.map(move);
      if (cmd[0] !== image.bin.kvarena) return [`${name}: runs ${cmd[0]}, not ${image.bin.kvarena}`];
      const r = await run(bins.kvarena, cmd.slice(1), c[name].timeoutSeconds * 1000);
      if (r.code !== 0 || r.out.trim() !== 'SERVING') errors.push(`${name}: exit ${r.code}: ${r.out.trim()}`);
    }
    const fdSocket = flags.get('fd_socket') ? move(flags.get('fd_socket')) : `${move(socket)}.fds`;
    for (const s of [move(socket), fdSocket]) {
      const st = fs.statSync(s);
      if (!st.isSocket() || (st.mode & 0o777) !== mode || st.gid !== process.getgid()) {
        errors.push(`${s}: mode ${(st.mode & 0o777).toString(8)} gid ${st.gid}, wanted ${mode.toString(8)} gid ${process.getgid()}`);
      }
    }
    const metricsPath = owner.spec.template.metadata.annotations['prometheus.io/path'];
    const m = await get(`http://127.0.0.1:${port}${metricsPath}`);
    if (m.status !== 200 || !/^kvarena_info\{/m.test(m.body)) errors.push(`GET ${metricsPath}: ${m.status}`);
    d.child.kill('SIGTERM');
    const code = await waitExit(d.child, kExitBoundMs);
    if (code !== 0) errors.push(`kvarenad exited ${code} after SIGTERM:`, ...d.log.trim().split('\n'));
    return errors;
  } finally {
    fs.rmSync(dir, {recursive: true, force: true});
  }
}

async function main() {
  console.log(`kubectl: ${kKubectl}: ${execFileSync(kKubectl, ['version', '--client'], {encoding: 'utf8'})
      .split('\n').filter(Boolean).join('; ')}`);
  const image = imageFacts();
  await check('deploy/Dockerfile: a numeric non-root USER, kvarenad and kvarena installed, scripts it names exist',
              () => image.errors.concat(image.uid > 0 ? [] : ['the image user must not be root']));

  await check('every kustomization under deploy/kubernetes is listed in this test', () => {
    const found = kustomizationDirs(kKube);
    const listed = Object.keys(kKustomizations).sort();
    return JSON.stringify(found) === JSON.stringify(listed) ? [] :
        [`found ${found.join(', ')}; listed ${listed.join(', ')}`];
  });

  const strict = new StrictFields();
  const renders = {};
  for (const [rel, expect] of Object.entries(kKustomizations)) {
    await check(`${rel}: renders`, () => {
      renders[rel] = render(rel);
      return renders[rel].length ? [] : ['no objects'];
    });
    if (!renders[rel]) continue;
    await check(`${rel}: ${renders[rel].map((o) => o.kind).join(', ')} valid against the Kubernetes schemas, no unknown fields`,
                () => renders[rel].flatMap((o) => [...schemaErrors(o), ...strict.check(o)]));
    if (expect.form === 'monitoring') continue;
    await check(`${rel}: invariants (${expect.form}, --backend=${expect.backend})`,
                () => checkRender(renders[rel], expect, image));
    const listed = kPodSecurityExceptions.filter((e) => e.overlays.includes(rel)).length;
    await check(`${rel}: Pod Security Standards, ${kControls.length} baseline and restricted controls on ` +
                `${podTemplates(renders[rel]).length} pod templates, ${listed} listed exceptions`,
                () => podSecurityErrors(rel, renders[rel]));
  }
  await check('every listed Pod Security exception names a kustomization, a control, a field and a reason', () =>
    kPodSecurityExceptions.flatMap((e) => {
      const bad = e.overlays.filter((o) => !kKustomizations[o]);
      if (!kControls.some((c) => c.name === e.control)) bad.push(`control "${e.control}"`);
      if (!e.field || !e.reason) bad.push('no field or reason');
      return bad.map((b) => `${e.workload} ${e.control}: ${b}`);
    }));
  if (renders.monitoring) {
    await check('monitoring: the ServiceMonitor selects every metrics Service by its port', () => {
      const services = Object.values(renders).flat().filter(
          (o) => o.kind === 'Service' && (o.metadata.labels || {})['app.kubernetes.io/component'] === 'kvarena-metrics');
      return services.length ? checkMonitoring(renders.monitoring.filter((o) => o.kind === 'ServiceMonitor'), services) :
                               ['no metrics Service rendered'];
    });
  }

  if (renders['overlays/gpu'] && renders.daemonset && renders['redis-tier/sidecar']) {
    for (const n of mutations(renders['overlays/gpu'], renders.daemonset, renders['redis-tier/sidecar'])) {
      await check(`negative: ${n.what} is rejected (${n.by})`, () => {
        const objects = [].concat(n.make());
        let errors;
        if (n.by === 'strict') errors = objects.flatMap((o) => strict.check(o));
        else if (n.by === 'schema') errors = objects.flatMap(schemaErrors);
        else errors = checkRender(objects, kKustomizations[n.by === 'gpu' ? 'overlays/gpu' : n.by], image);
        return errors.some((e) => e.includes(n.expect)) ? [] :
            [`expected an error containing "${n.expect}", got:`, ...(errors.length ? errors : ['(none)'])];
      });
    }
  }

  if (renders['overlays/gpu'] && renders.daemonset) {
    const cases = podSecurityMutations(renders['overlays/gpu'], renders.daemonset);
    await check('every Pod Security control has a negative case', () => kControls
        .filter((c) => !cases.some((n) => n.expect && n.expect.control === c.name))
        .map((c) => `no mutation is expected to fail "${c.name}"`));
    for (const n of cases) {
      await check(`pod security: ${n.what} ${n.expect ? 'is rejected' : 'passes'} (${n.overlay})`,
                  () => podSecurityCase(n));
    }
  }

  if (!argv.kvarenad || !argv.kvarena) {
    console.log('# no --kvarenad / --kvarena: the checks against the real daemon are skipped');
  } else {
    const bins = {kvarenad: argv.kvarenad, kvarena: argv.kvarena};
    for (const [rel, objects] of Object.entries(renders)) {
      for (const {owner, c} of daemonContainers(objects)) {
        await check(`${rel}: kvarenad starts with the rendered args, the rendered probes pass, sockets, metrics, SIGTERM`,
                    () => runRendered(owner, c, image, bins));
      }
    }
    await check('negative: kvarenad refuses an unknown flag (so the run above checks flag names)', async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvarena-deploy.'));
      try {
        const d = await startDaemon(bins.kvarenad, [`--listen=unix:${dir}/k.sock`, '--metrics_prot=9464'],
            kStartBoundMs);
        if (d.exited === undefined) {
          d.child.kill('SIGKILL');
          return ['kvarenad started'];
        }
        return d.exited !== 0 && /metrics_prot/.test(d.log) ? [] : [`exit ${d.exited}: ${d.log}`];
      } finally {
        fs.rmSync(dir, {recursive: true, force: true});
      }
    });
    await check('deploy/runtime-packages.sh names installed runtime packages of the binaries\' libraries', () => {
      // A CUDA build here links the toolkit nvcc came with, which may not be a Debian package
      // (the image installs it from NVIDIA's repository, where dpkg knows it).
      const out = execFileSync(path.join(kRoot, 'deploy', 'runtime-packages.sh'), [bins.kvarenad, bins.kvarena],
                               {encoding: 'utf8', env: {...process.env, UNPACKAGED_OK: '/usr/local/cuda:/opt/cuda'}});
      const pkgs = out.split('\n').filter(Boolean);
      console.log(`#   ${pkgs.join(' ')}`);
      const errors = [];
      for (const want of ['libc6', 'libstdc++6']) if (!pkgs.includes(want)) errors.push(`${want} missing`);
      if (!pkgs.some((p) => /^libgrpc\+\+/.test(p))) errors.push('no libgrpc++ package');
      for (const p of pkgs) if (/-dev$/.test(p)) errors.push(`${p}: a -dev package`);
      return errors;
    });
  }

  const failed = results.filter((r) => r.errors.length);
  console.log(`deploy_test: ${results.length - failed.length} passed, ${failed.length} failed`);
  process.exit(failed.length ? 1 : 0);
}

main().catch((e) => {
  console.log(`deploy_test: ${e.stack || e}`);
  process.exit(1);
});
