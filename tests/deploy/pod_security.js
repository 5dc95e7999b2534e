// The Pod Security Standards' controls, checked on every pod template of rendered manifests.
//
// kControls is the table of the "baseline" and "restricted" controls as
// https://kubernetes.io/docs/concepts/security/pod-security-standards/ defines them for
// Kubernetes 1.33, each under the name the page gives it (a control on both levels, as
// Capabilities and Seccomp are, has one entry per level). check(pod) returns one violation
// per offending field: {container, field, value}, container undefined for the pod's own
// fields. Every container counts: containers, initContainers (native sidecars included) and
// ephemeralContainers. A pod-level setting counts for a container that leaves it unset.
//
// podSecurityViolations(objects) applies every control to every pod template it finds: any
// object with spec.containers (a Pod) and any object holding one (Deployment, DaemonSet,
// StatefulSet, Job, CronJob's jobTemplate...), so a new workload kind is checked without
// being named here. Windows pods get no exemption: these manifests are Linux-only.
'use strict';

const kBaselineCapabilities = new Set(['AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL',
                                       'MKNOD', 'NET_BIND_SERVICE', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID',
                                       'SYS_CHROOT']);
const kSafeSysctls = new Set(['kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range',
                              'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_syncookies',
                              'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports',
                              'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout',
                              'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes']);
const kSeLinuxTypes = new Set(['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']);
const kRestrictedVolumes = new Set(['configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral',
                                    'persistentVolumeClaim', 'projected', 'secret']);
const kAppArmorAnnotation = 'container.apparmor.security.beta.kubernetes.io/';

// Every container of a pod spec, with the field path it sits at.
function containersOf(spec) {
  return ['initContainers', 'containers', 'ephemeralContainers'].flatMap(
      (list) => (spec[list] || []).map((c, i) => ({c, at: `spec.${list}[${i}]`})));
}

// Helpers for the checks: a violation, and a setting read from the container or the pod.
const bad = (container, field, value) => ({container, field, value});
const sc = (c) => c.securityContext || {};
const psc = (pod) => pod.spec.securityContext || {};

// A check over each container's securityContext: fn(sc, at, c) returns [field, value] pairs.
function perContainer(fn) {
  return (pod) => containersOf(pod.spec).flatMap(({c, at}) =>
    fn(sc(c), `${at}.securityContext`, c).map(([field, value]) => bad(c.name, field, value)));
}

// A check of the pod's securityContext and every container's: fn(sc, at) returns pairs.
function podAndContainers(fn) {
  return (pod) => [
    ...fn(psc(pod), 'spec.securityContext').map(([field, value]) => bad(undefined, field, value)),
    ...perContainer(fn)(pod)];
}

const kControls = [
  {name: 'HostProcess', level: 'baseline',
   check: podAndContainers((s, at) => ((s.windowsOptions || {}).hostProcess === true ?
     [[`${at}.windowsOptions.hostProcess`, true]] : []))},
  {name: 'Host Namespaces', level: 'baseline',
   check: (pod) => ['hostNetwork', 'hostPID', 'hostIPC'].filter((f) => pod.spec[f] === true)
     .map((f) => bad(undefined, `spec.${f}`, true))},
  {name: 'Privileged Containers', level: 'baseline',
   check: perContainer((s, at) => (s.privileged === true ? [[`${at}.privileged`, true]] : []))},
  {name: 'Capabilities (baseline)', level: 'baseline',
   check: perContainer((s, at) => ((s.capabilities || {}).add || [])
     .filter((cap) => !kBaselineCapabilities.has(cap)).map((cap) => [`${at}.capabilities.add`, cap]))},
  {name: 'HostPath Volumes', level: 'baseline',
   check: (pod) => (pod.spec.volumes || []).flatMap((v, i) => (v.hostPath ?
     [bad(undefined, `spec.volumes[${i}].hostPath`, v.hostPath)] : []))},
  {name: 'Host Ports', level: 'baseline',
   check: (pod) => containersOf(pod.spec).flatMap(({c, at}) => (c.ports || []).flatMap((p, i) =>
     (p.hostPort ? [bad(c.name, `${at}.ports[${i}].hostPort`, p.hostPort)] : [])))},
  {name: 'AppArmor', level: 'baseline',
   check: (pod) => [
     ...podAndContainers((s, at) => {
       const type = (s.appArmorProfile || {}).type;
       return type === undefined || type === 'RuntimeDefault' || type === 'Localhost' ? [] :
           [[`${at}.appArmorProfile.type`, type]];
     })(pod),
     ...Object.entries((pod.metadata || {}).annotations || {})
       .filter(([k, v]) => k.startsWith(kAppArmorAnnotation) && v !== 'runtime/default' && !v.startsWith('localhost/'))
       .map(([k, v]) => bad(k.slice(kAppArmorAnnotation.length), `metadata.annotations['${k}']`, v))]},
  {name: 'SELinux', level: 'baseline',
   check: podAndContainers((s, at) => {
     const o = s.seLinuxOptions || {};
     const out = [];
     if (o.type !== undefined && !kSeLinuxTypes.has(o.type)) out.push([`${at}.seLinuxOptions.type`, o.type]);
     for (const f of ['user', 'role']) if (o[f] !== undefined && o[f] !== '') out.push([`${at}.seLinuxOptions.${f}`, o[f]]);
     return out;
   })},
  {name: '/proc Mount Type', level: 'baseline',
   check: perContainer((s, at) => (s.procMount !== undefined && s.procMount !== 'Default' ?
     [[`${at}.procMount`, s.procMount]] : []))},
  {name: 'Seccomp (baseline)', level: 'baseline',
   check: podAndContainers((s, at) => ((s.seccompProfile || {}).type === 'Unconfined' ?
     [[`${at}.seccompProfile.type`, 'Unconfined']] : []))},
  {name: 'Sysctls', level: 'baseline',
   check: (pod) => (psc(pod).sysctls || []).flatMap((s, i) => (kSafeSysctls.has(s.name) ? [] :
     [bad(undefined, `spec.securityContext.sysctls[${i}].name`, s.name)]))},

  {name: 'Volume Types', level: 'restricted',
   check: (pod) => (pod.spec.volumes || []).flatMap((v, i) => Object.keys(v)
     .filter((k) => k !== 'name' && !kRestrictedVolumes.has(k)).map((k) => bad(undefined, `spec.volumes[${i}].${k}`, v[k])))},
  {name: 'Privilege Escalation', level: 'restricted',
   check: perContainer((s, at) => (s.allowPrivilegeEscalation === false ? [] :
     [[`${at}.allowPrivilegeEscalation`, s.allowPrivilegeEscalation]]))},
  // runAsNonRoot true on the pod (no container setting it false), or on every container.
  {name: 'Running as Non-root', level: 'restricted',
   check: (pod) => {
     const podValue = psc(pod).runAsNonRoot;
     if (podValue !== undefined && podValue !== true) return [bad(undefined, 'spec.securityContext.runAsNonRoot', podValue)];
     return perContainer((s, at) => {
       const v = s.runAsNonRoot !== undefined ? s.runAsNonRoot : podValue;
       return v === true ? [] : [[`${at}.runAsNonRoot`, v]];
     })(pod);
   }},
  {name: 'Running as Non-root user', level: 'restricted',
   check: podAndContainers((s, at) => (s.runAsUser === 0 ? [[`${at}.runAsUser`, 0]] : []))},
  // RuntimeDefault or Localhost on the pod (containers may leave it unset), or on every container.
  {name: 'Seccomp (restricted)', level: 'restricted',
   check: (pod) => {
     const ok = (t) => t === 'RuntimeDefault' || t === 'Localhost';
     const podType = (psc(pod).seccompProfile || {}).type;
     const out = podType === undefined || ok(podType) ? [] : [bad(undefined, 'spec.securityContext.seccompProfile.type', podType)];
     return out.concat(perContainer((s, at) => {
       const t = s.seccompProfile ? s.seccompProfile.type : podType;
       return ok(t) ? [] : [[`${at}.seccompProfile.type`, t]];
     })(pod));
   }},
  {name: 'Capabilities (restricted)', level: 'restricted',
   check: perContainer((s, at) => {
     const caps = s.capabilities || {};
     const out = (caps.drop || []).includes('ALL') ? [] : [[`${at}.capabilities.drop`, caps.drop]];
     return out.concat((caps.add || []).filter((cap) => cap !== 'NET_BIND_SERVICE')
       .map((cap) => [`${at}.capabilities.add`, cap]));
   })},
];

// Every pod template in objects: {workload: "Kind/name", metadata, spec, at}.
function podTemplates(objects) {
  const out = [];
  const walk = (node, workload, at) => {
    if (!node || typeof node !== 'object') return;
    if (node.spec && Array.isArray(node.spec.containers)) {
      out.push({workload, metadata: node.metadata || {}, spec: node.spec, at});
      return;
    }
    for (const [k, v] of Object.entries(node)) walk(v, workload, at ? `${at}.${k}` : k);
  };
  for (const o of objects) walk(o, `${o.kind}/${(o.metadata || {}).name}`, '');
  return out;
}

// Every violation of every control in every pod template of objects:
// {workload, container, control, level, field, value}.
function podSecurityViolations(objects) {
  return podTemplates(objects).flatMap((pod) => kControls.flatMap((control) =>
    control.check(pod).map((v) => ({workload: pod.workload, control: control.name, level: control.level, ...v,
                                    field: pod.at ? `${pod.at}.${v.field}` : v.field}))));
}

// "Kind/name container: control: field = value", for messages.
function describe(v) {
  return `${v.workload}${v.container ? ` ${v.container}` : ''}: ${v.control}: ${v.field} = ${JSON.stringify(v.value)}`;
}

// The violations of one render that no exception lists (unlisted), and the exceptions that
// matched nothing (unused: a control met since, whose exception must go). An exception is
// {overlays, workload, container (undefined: the pod's own fields), control, field, value,
// reason}: it excuses that one field with that one value, so another violation of the same
// control in the same workload (a second hostPath, another capability) is still reported.
function unexcepted(overlay, objects, exceptions) {
  const mine = exceptions.filter((e) => e.overlays.includes(overlay));
  const used = new Set();
  const unlisted = [];
  for (const v of podSecurityViolations(objects)) {
    const e = mine.find((x) => x.workload === v.workload && x.container === v.container && x.control === v.control &&
                               x.field === v.field && JSON.stringify(x.value) === JSON.stringify(v.value));
    if (e) used.add(e);
    else unlisted.push(v);
  }
  return {unlisted, unused: mine.filter((e) => !used.has(e))};
}

module.exports = {kControls, podTemplates, podSecurityViolations, unexcepted, describe};
