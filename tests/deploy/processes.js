// Child processes and loopback HTTP for deploy_test.js: the real daemon started, probed and
// stopped the way the kubelet would.
'use strict';

const {spawn} = require('child_process');
const http = require('http');
const net = require('net');

// A TCP port on loopback that nothing listened on a moment ago.
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const {port} = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Resolves child's exit code (or signal), or 'killed: no exit' if it outlives boundMs.
function waitExit(child, boundMs) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve(child.exitCode);
    const guard = setTimeout(() => { child.kill('SIGKILL'); resolve('killed: no exit'); }, boundMs);
    child.on('exit', (code, signal) => { clearTimeout(guard); resolve(code === null ? signal : code); });
  });
}

// Starts kvarenad with args; resolves {child, log} once it printed its start line, or
// {child, log, exited} if it exited first; kills it if neither comes within boundMs.
function startDaemon(bin, args, boundMs) {
  return new Promise((resolve) => {
    const child = spawn(bin, args, {stdio: ['ignore', 'pipe', 'pipe']});
    const state = {child, log: ''};
    const guard = setTimeout(() => { child.kill('SIGKILL'); }, boundMs);
    const onData = (d) => {
      state.log += d;
      if (/kvarenad: serving/.test(state.log)) {
        clearTimeout(guard);
        resolve(state);
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', (d) => { state.log += d; });
    child.on('exit', (code, signal) => {
      clearTimeout(guard);
      state.exited = code === null ? signal : code;
      resolve(state);
    });
  });
}

// Runs cmd to its exit (killed after timeoutMs); resolves {code, out}, out = stdout + stderr.
function run(cmd, args, timeoutMs) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, {stdio: ['ignore', 'pipe', 'pipe']});
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const guard = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('exit', (code, signal) => { clearTimeout(guard); resolve({code: code === null ? signal : code, out}); });
  });
}

// An HTTP GET; resolves {status, body}.
function get(url) {
  return new Promise((resolve, reject) => {
    http.get(url, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({status: res.statusCode, body}));
    }).on('error', reject);
  });
}

module.exports = {freePort, waitExit, startDaemon, run, get};
