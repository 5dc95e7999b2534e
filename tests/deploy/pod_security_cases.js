// What deploy/kubernetes promises about the Pod Security Standards (pod_security.js), and the
// mutated manifests that prove the checker can fail.
//
// kPodSecurityExceptions: every field by which a rendered overlay fails a control by design,
// with the reason (docs/kubernetes.md#pod-security says the same). Nothing else may fail:
// the sidecar overlays meet every baseline and restricted control.
//
// podSecurityMutations(sidecar, daemonset) builds the table-driven cases from two renders
// (overlays/gpu and daemonset): each is {what, overlay, objects, expect}, expect being the
// {workload, container, control} the checker must report (an unexcepted violation), null
// where the change is allowed by the standard and nothing may be reported, or {unused} where
// an exception must be reported as no longer needed. podSecurityCase(case) returns [] when the
// checker answers a case as expected; podSecurityErrors(overlay, objects) the render's
// violations no exception lists and the exceptions it does not need.
'use strict';

const kDaemonSetForms = ['daemonset', 'redis-tier/daemonset'];
const kSocketDir = {path: '/run/kvarena', type: 'DirectoryOrCreate'};
const kWorkerSocketDir = {path: '/run/kvarena', type: 'Directory'};
const kHostPathWhy = "the sockets live in the node's /run/kvarena, shared with the worker pods on the node";
const kRootStepWhy = 'the one root step: the kubelet creates /run/kvarena as root:root, and this chowns it ' +
                     'to 10001:10100 (drop it where nodes create the directory, systemd-tmpfiles)';

const ds = 'DaemonSet/kvarenad';
const dsWorker = 'Deployment/model-worker-node-kvarena';
const tpl = 'spec.template.spec';
const kPodSecurityExceptions = [
  {overlays: kDaemonSetForms, workload: ds, control: 'HostPath Volumes',
   field: `${tpl}.volumes[0].hostPath`, value: kSocketDir, reason: kHostPathWhy},
  {overlays: kDaemonSetForms, workload: ds, control: 'Volume Types',
   field: `${tpl}.volumes[0].hostPath`, value: kSocketDir, reason: kHostPathWhy},
  {overlays: kDaemonSetForms, workload: ds, container: 'socket-dir', control: 'Running as Non-root',
   field: `${tpl}.initContainers[0].securityContext.runAsNonRoot`, value: false, reason: kRootStepWhy},
  {overlays: kDaemonSetForms, workload: ds, container: 'socket-dir', control: 'Running as Non-root user',
   field: `${tpl}.initContainers[0].securityContext.runAsUser`, value: 0, reason: kRootStepWhy},
  {overlays: kDaemonSetForms, workload: ds, container: 'socket-dir', control: 'Capabilities (restricted)',
   field: `${tpl}.initContainers[0].securityContext.capabilities.add`, value: 'CHOWN',
   reason: 'the chown needs CAP_CHOWN (baseline allows adding it, restricted does not)'},
  {overlays: kDaemonSetForms, workload: dsWorker, control: 'HostPath Volumes',
   field: `${tpl}.volumes[0].hostPath`, value: kWorkerSocketDir, reason: kHostPathWhy},
  {overlays: kDaemonSetForms, workload: dsWorker, control: 'Volume Types',
   field: `${tpl}.volumes[0].hostPath`, value: kWorkerSocketDir, reason: kHostPathWhy},
];

const {unexcepted, describe} = require('./pod_security');

const clone = (x) => JSON.parse(JSON.stringify(x));

function podSecurityMutations(sidecar, daemonset) {
  const dep = sidecar.find((o) => o.kind === 'Deployment');
  const sideWorkload = `Deployment/${dep.metadata.name}`;
  // A case on the sidecar render: change(pod spec, whole Deployment) mutates a copy.
  const side = (what, expect, change) => {
    const o = clone(dep);
    change(o.spec.template.spec, o);
    return {what, overlay: 'overlays/gpu', objects: [o],
            expect: expect && {workload: sideWorkload, ...expect}};
  };
  // A case on the DaemonSet render (its listed exceptions apply).
  const node = (what, expect, change) => {
    const objects = clone(daemonset);
    change(objects.find((o) => o.kind === 'DaemonSet').spec.template.spec);
    return {what, overlay: 'daemonset', objects, expect: expect && {workload: ds, ...expect}};
  };
  // The sidecar's pod template in another workload kind, hostNetwork set.
  const wrapped = (kind, wrap) => {
    const t = clone(dep.spec.template);
    t.spec.hostNetwork = true;
    return {what: `a ${kind}'s pod with hostNetwork`, overlay: 'overlays/gpu', objects: [wrap(t)],
            expect: {workload: `${kind}/x`, control: 'Host Namespaces'}};
  };
  const kv = (p) => p.initContainers[0];  // kvarenad, the native sidecar
  const worker = (p) => p.containers[0];
  const ctx = (c) => (c.securityContext = c.securityContext || {});
  const debug = (sc) => ({name: 'debug', image: 'busybox', securityContext: sc});
  const hardened = () => ({allowPrivilegeEscalation: false, capabilities: {drop: ['ALL']}});
  const c = (container, control) => ({container, control});
  const pod = (control) => ({control});
  return [
    side('a Windows HostProcess pod', pod('HostProcess'),
         (p) => { p.securityContext.windowsOptions = {hostProcess: true}; }),
    side('a HostProcess worker', c('worker', 'HostProcess'),
         (p) => { ctx(worker(p)).windowsOptions = {hostProcess: true}; }),
    side('hostNetwork', pod('Host Namespaces'), (p) => { p.hostNetwork = true; }),
    side('hostPID', pod('Host Namespaces'), (p) => { p.hostPID = true; }),
    side('hostIPC', pod('Host Namespaces'), (p) => { p.hostIPC = true; }),
    side('a privileged sidecar (init container)', c('kvarenad', 'Privileged Containers'),
         (p) => { ctx(kv(p)).privileged = true; }),
    side('a privileged ephemeral container', c('debug', 'Privileged Containers'),
         (p) => { p.ephemeralContainers = [debug({...hardened(), privileged: true})]; }),
    side('CAP_SYS_ADMIN added', c('worker', 'Capabilities (baseline)'),
         (p) => { worker(p).securityContext.capabilities.add = ['SYS_ADMIN']; }),
    side('a hostPath volume', pod('HostPath Volumes'),
         (p) => { p.volumes.push({name: 'h', hostPath: {path: '/var/run'}}); }),
    side('a hostPort', c('kvarenad', 'Host Ports'), (p) => { kv(p).ports[0].hostPort = 9464; }),
    side('an unconfined AppArmor pod', pod('AppArmor'),
         (p) => { p.securityContext.appArmorProfile = {type: 'Unconfined'}; }),
    side('an unconfined AppArmor container', c('worker', 'AppArmor'),
         (p) => { ctx(worker(p)).appArmorProfile = {type: 'Unconfined'}; }),
    side('an unconfined AppArmor annotation', c('worker', 'AppArmor'), (p, o) => {
      o.spec.template.metadata.annotations['container.apparmor.security.beta.kubernetes.io/worker'] = 'unconfined';
    }),
    side('SELinux type spc_t', c('kvarenad', 'SELinux'), (p) => { ctx(kv(p)).seLinuxOptions = {type: 'spc_t'}; }),
    side('a SELinux user on the pod', pod('SELinux'),
         (p) => { p.securityContext.seLinuxOptions = {user: 'system_u'}; }),
    side('procMount Unmasked', c('worker', '/proc Mount Type'), (p) => { ctx(worker(p)).procMount = 'Unmasked'; }),
    side('seccomp Unconfined on a container', c('worker', 'Seccomp (baseline)'),
         (p) => { ctx(worker(p)).seccompProfile = {type: 'Unconfined'}; }),
    side('an unsafe sysctl', pod('Sysctls'),
         (p) => { p.securityContext.sysctls = [{name: 'kernel.msgmax', value: '65536'}]; }),
    side('an nfs volume', pod('Volume Types'),
         (p) => { p.volumes.push({name: 'n', nfs: {server: 'nfs', path: '/'}}); }),
    side('a gitRepo volume', pod('Volume Types'),
         (p) => { p.volumes.push({name: 'g', gitRepo: {repository: 'https://example/x'}}); }),
    side('the sidecar (init container) without allowPrivilegeEscalation', c('kvarenad', 'Privilege Escalation'),
         (p) => { delete kv(p).securityContext.allowPrivilegeEscalation; }),
    side('an ephemeral container without a securityContext', c('debug', 'Privilege Escalation'),
         (p) => { p.ephemeralContainers = [{name: 'debug', image: 'busybox'}]; }),
    side('runAsNonRoot false on the pod', pod('Running as Non-root'),
         (p) => { p.securityContext.runAsNonRoot = false; }),
    side('runAsNonRoot false on the worker', c('worker', 'Running as Non-root'),
         (p) => { worker(p).securityContext.runAsNonRoot = false; }),
    side('runAsNonRoot on neither the pod nor the worker', c('worker', 'Running as Non-root'), (p) => {
      delete p.securityContext.runAsNonRoot;
      delete worker(p).securityContext.runAsNonRoot;
    }),
    side('the worker as uid 0', c('worker', 'Running as Non-root user'),
         (p) => { worker(p).securityContext.runAsUser = 0; }),
    side('the pod as uid 0', pod('Running as Non-root user'), (p) => { p.securityContext.runAsUser = 0; }),
    side('no seccompProfile on the pod (nor the containers)', c('kvarenad', 'Seccomp (restricted)'),
         (p) => { delete p.securityContext.seccompProfile; }),
    side('capabilities not dropped on the sidecar', c('kvarenad', 'Capabilities (restricted)'),
         (p) => { delete kv(p).securityContext.capabilities.drop; }),
    side('CAP_CHOWN added (baseline allows it, restricted does not)', c('worker', 'Capabilities (restricted)'),
         (p) => { worker(p).securityContext.capabilities.add = ['CHOWN']; }),
    wrapped('Pod', (t) => ({apiVersion: 'v1', kind: 'Pod', metadata: {...t.metadata, name: 'x'}, spec: t.spec})),
    wrapped('StatefulSet', (t) => ({apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: {name: 'x'},
                                    spec: {serviceName: 'x', selector: {}, template: t}})),
    wrapped('CronJob', (t) => ({apiVersion: 'batch/v1', kind: 'CronJob', metadata: {name: 'x'},
                                spec: {schedule: '* * * * *', jobTemplate: {spec: {template: t}}}})),
    // The DaemonSet's exceptions excuse their fields only.
    node('a second hostPath in the DaemonSet', pod('HostPath Volumes'),
         (p) => { p.volumes.push({name: 'k', hostPath: {path: '/var/lib/kubelet'}}); }),
    node("the DaemonSet's hostPath on / instead of /run/kvarena", pod('HostPath Volumes'),
         (p) => { p.volumes[0].hostPath.path = '/'; }),
    node('the socket-dir step adding CAP_SETUID too', c('socket-dir', 'Capabilities (restricted)'),
         (p) => { p.initContainers[0].securityContext.capabilities.add.push('SETUID'); }),
    node("the DaemonSet's kvarenad as uid 0", c('kvarenad', 'Running as Non-root user'),
         (p) => { p.containers[0].securityContext.runAsUser = 0; }),
    node('a DaemonSet with hostPID', pod('Host Namespaces'), (p) => { p.hostPID = true; }),
    {...node('a DaemonSet without the socket-dir step', null, (p) => { p.initContainers = []; }),
     expect: {unused: 'socket-dir'}},
    // Allowed by the standard: nothing may be reported.
    side('seccomp Localhost on the pod', null,
         (p) => { p.securityContext.seccompProfile = {type: 'Localhost', localhostProfile: 'kvarena.json'}; }),
    side('CAP_NET_BIND_SERVICE added', null,
         (p) => { worker(p).securityContext.capabilities.add = ['NET_BIND_SERVICE']; }),
    side('a safe sysctl', null,
         (p) => { p.securityContext.sysctls = [{name: 'net.ipv4.ip_unprivileged_port_start', value: '0'}]; }),
    side('SELinux type container_t, AppArmor RuntimeDefault', null, (p) => {
      p.securityContext.seLinuxOptions = {type: 'container_t'};
      p.securityContext.appArmorProfile = {type: 'RuntimeDefault'};
    }),
    side('runAsNonRoot on every container instead of the pod', null,
         (p) => { delete p.securityContext.runAsNonRoot; }),
    side('a hardened ephemeral container', null, (p) => { p.ephemeralContainers = [debug(hardened())]; }),
  ];
}

// A render's violations that kPodSecurityExceptions does not list, and listed exceptions it
// no longer needs.
function podSecurityErrors(rel, objects) {
  const {unlisted, unused} = unexcepted(rel, objects, kPodSecurityExceptions);
  return [...unlisted.map(describe),
          ...unused.map((e) => `listed exception not needed: ${describe(e)}`)];
}

// One case of podSecurityMutations: the violation it expects is reported, or nothing is.
function podSecurityCase(n) {
  const {unlisted, unused} = unexcepted(n.overlay, n.objects, kPodSecurityExceptions);
  const got = [...unlisted.map(describe), ...unused.map((e) => `listed exception not needed: ${describe(e)}`)];
  const e = n.expect;
  let found;
  if (!e) found = got.length === 0;
  else if (e.unused) found = unused.some((x) => x.container === e.unused);
  else found = unlisted.some((v) => v.workload === e.workload && v.container === e.container &&
                                    v.control === e.control);
  if (found) return [];
  const want = !e ? 'nothing reported' : e.unused ? `an unused exception of ${e.unused}` :
      `${e.workload}${e.container ? ` ${e.container}` : ''}: ${e.control}`;
  return [`expected ${want}, got:`, ...(got.length ? got : ['(none)'])];
}

module.exports = {kPodSecurityExceptions, podSecurityMutations, podSecurityErrors, podSecurityCase};
