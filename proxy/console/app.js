// memory-proxy console: a framework-free client of the gateway's management API.
//
// Sign-in asks GET /v1/me who the key is: a user-bound key (or JWT) opens the user view, an
// admin key the admin view (which can open any user of its tenant, sending X-User-Id).
// The key is kept in sessionStorage only and sent in the Authorization header, never in a
// URL. Everything is built with DOM calls (no innerHTML with data), so text from memories
// cannot inject markup, and the page runs under the gateway's strict Content-Security-Policy
// (no inline script or style: bar widths are set through the CSSOM).
"use strict";
(() => {
  const KEY_STORE = "memory-proxy-console-key";
  const CATEGORIES = ["user_preference", "business", "technical", "organizational", "domain"];
  const AUDIT_ACTIONS = ["created", "merged", "edited", "retired", "deleted", "cleared",
    "disabled", "enabled", "imported", "erased", "promoted", "rejected", "settings_changed"];
  const AUDIT_ACTORS = ["learning", "user", "admin", "system"];
  const SETTINGS = [
    ["learning.enabled", "bool"],
    ["learning.score_threshold", "float"],
    ["learning.batch_messages", "int"],
    ["learning.max_memory_per_user", "int"],
    ["learning.retention_days", "int"],
    ["learning.model", "text"],
    ["memory.injection_count", "int"],
    ["memory.token_budget_percent", "float"],
    ["learning.budget.tokens_per_day", "int?"],
    ["learning.budget.tokens_per_month", "int?"],
  ];
  // The API lives beside /console (a gateway mounted under a path prefix keeps it).
  const BASE = location.pathname.replace(/\/console(\/.*)?$/, "");

  // ---------------------------------------------------------------- text
  const TEXT = window.CONSOLE_TEXT;
  const LANG = /^zh\b/i.test((navigator.languages && navigator.languages[0])
    || navigator.language || "en") ? "zh" : "en";
  function t(key, vars) {
    const template = (TEXT[LANG] && TEXT[LANG][key]) || TEXT.en[key] || key;
    return template.replace(/\{(\w+)\}/g, (_, name) =>
      vars && vars[name] !== undefined && vars[name] !== null ? String(vars[name]) : "");
  }
  // A category's label; an unknown one (a newer gateway) is shown as the API names it.
  const cat = (name) => (TEXT.en[`cat.${name}`] ? t(`cat.${name}`) : name);
  function when(iso, dateOnly) {
    if (!iso) return "—";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    const locale = LANG === "zh" ? "zh-CN" : "en-US";
    return dateOnly ? d.toLocaleDateString(locale) : d.toLocaleString(locale);
  }

  // ---------------------------------------------------------------- DOM
  let uid = 0;
  const nextId = (prefix) => `${prefix}-${++uid}`;
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else if (name === "class") el.className = value;
      else if (name === "text") el.textContent = value;
      else if (name === "value") el.value = value;
      else if (name === "checked") el.checked = Boolean(value);
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }
  const $ = (id) => document.getElementById(id);
  function field(labelText, control, help) {
    control.id = control.id || nextId("f");
    const helpEl = help ? h("p", { class: "help", id: nextId("help") }, help) : null;
    if (helpEl) control.setAttribute("aria-describedby", helpEl.id);
    const error = h("p", { class: "field-error", id: nextId("err"), hidden: true });
    const wrap = h("div", { class: "field" }, h("label", { for: control.id }, labelText), control,
      helpEl, error);
    wrap.control = control;
    wrap.error = error;
    return wrap;
  }
  function checkbox(labelText, checked, onchange) {
    const box = h("input", { type: "checkbox", checked, onchange });
    return h("label", { class: "check" }, box, h("span", {}, labelText));
  }
  function showFieldError(wrap, message) {
    wrap.error.textContent = message;
    wrap.error.hidden = false;
    wrap.control.setAttribute("aria-invalid", "true");
    const described = (wrap.control.getAttribute("aria-describedby") || "").split(" ");
    if (!described.includes(wrap.error.id)) {
      wrap.control.setAttribute("aria-describedby", [...described, wrap.error.id].join(" ").trim());
    }
    wrap.control.focus();
  }
  function clearFieldError(wrap) {
    wrap.error.hidden = true;
    wrap.error.textContent = "";
    wrap.control.removeAttribute("aria-invalid");
  }
  function status(message, bad) {
    const box = $("status");
    box.className = bad ? "status bad" : "status";
    box.textContent = message;
    clearTimeout(status.timer);
    status.timer = setTimeout(() => { box.textContent = ""; }, bad ? 8000 : 3000);
  }
  function failed(err, where) {
    const message = t("error", { message: err.message || String(err) });
    if (where) where.replaceChildren(h("p", { class: "field-error", role: "alert" }, message));
    else status(message, true);
  }
  function table(headers, rows, caption) {
    // The wrapper scrolls sideways on narrow screens, so it is a focusable region.
    return h("div", { class: "table-wrap", tabindex: 0, role: "region",
      "aria-label": t("tableOf", { name: caption }) },
      h("table", {}, h("caption", { class: "visually-hidden" }, caption),
        h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" },
          x || h("span", { class: "visually-hidden" }, t("actions")))))),
        h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c)))))));
  }
  function bars(entries, label, scale) {
    // entries: [[text, value]]; the bar length is value / scale (default: the largest
    // value), set through the CSSOM.
    const max = scale || Math.max(1e-9, ...entries.map(([, v]) => Number(v) || 0));
    return h("ul", { class: "bars", "aria-label": label }, entries.map(([name, value]) => {
      const bar = h("div", { class: "bar" });
      bar.style.width = `${Math.max(0, Math.min(100, (100 * (Number(value) || 0)) / max))}%`;
      return h("li", {}, h("span", {}, `${name}: ${value}`), h("div", { class: "track" }, bar));
    }));
  }

  // ---------------------------------------------------------------- dialogs
  function openDialog(title, body, buttons) {
    // A modal <dialog>: Escape cancels, focus goes to the first control and back after.
    const dialog = $("dialog");
    const returnTo = document.activeElement;
    return new Promise((resolve) => {
      const finish = (value) => {
        dialog.close();
        dialog.replaceChildren();
        if (returnTo && returnTo.isConnected) returnTo.focus();
        resolve(value);
      };
      dialog.replaceChildren(h("h2", { id: "dialog-title" }, title), body,
        h("div", { class: "actions" }, buttons.map((b) =>
          h("button", { type: "button", class: b.class, onclick: async () => {
            if (!b.run) return finish(b.value);
            const result = await b.run();
            if (result !== undefined) finish(result);
          } }, b.label))));
      dialog.oncancel = (event) => { event.preventDefault(); finish(null); };
      dialog.showModal();
      const first = dialog.querySelector("input, textarea, select, button");
      if (first) first.focus();
    });
  }
  function confirmAction(message, okLabel) {
    return openDialog(t("confirm"), h("p", {}, message), [
      { label: t("cancel"), class: "quiet", value: false },
      { label: okLabel, class: "danger", value: true },
    ]).then(Boolean);
  }

  // ---------------------------------------------------------------- API
  const session = { key: null, me: null, tenant: "" };
  class ApiError extends Error {
    constructor(status, error) {
      super((error && error.message) || `HTTP ${status}`);
      this.status = status;
      this.param = error && error.param;
      this.code = error && error.code;
    }
  }
  // Header values are bytes: a UTF-8 user id is sent as its UTF-8 bytes, which the gateway
  // reads back as UTF-8 (proxy.identity.header_text).
  const headerBytes = (s) => String.fromCharCode(...new TextEncoder().encode(s));
  async function api(method, path, { body, user, query, raw } = {}) {
    const headers = { Authorization: `Bearer ${session.key}` };
    if (user) headers["X-User-Id"] = headerBytes(user);
    let payload;
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = typeof body === "string" ? body : JSON.stringify(body);
    }
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query || {})) {
      if (v !== undefined && v !== null && v !== "") params.set(k, String(v));
    }
    const qs = params.toString();
    const response = await fetch(`${BASE}${path}${qs ? `?${qs}` : ""}`, {
      method, headers, body: payload, cache: "no-store", credentials: "omit",
    });
    if (!response.ok) {
      let error = null;
      try { error = (await response.json()).error; } catch (_) { /* not JSON */ }
      throw new ApiError(response.status, error);
    }
    return raw ? response : response.json();
  }

  // ---------------------------------------------------------------- tabs
  function tabs(label, defs) {
    // WAI-ARIA tabs: arrow keys move between tabs, the panel renders on selection.
    const list = h("div", { class: "tabs", role: "tablist", "aria-label": label });
    const panel = h("div", { role: "tabpanel", tabindex: 0 });
    const buttons = defs.map((def, index) => h("button", {
      type: "button", role: "tab", id: nextId("tab"), "aria-selected": "false", tabindex: -1,
      onclick: () => select(index),
      onkeydown: (event) => {
        const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
        if (step) { select((index + step + defs.length) % defs.length); buttons[(index + step + defs.length) % defs.length].focus(); }
      },
    }, def.label));
    list.append(...buttons);
    function select(index) {
      buttons.forEach((b, i) => {
        b.setAttribute("aria-selected", String(i === index));
        b.tabIndex = i === index ? 0 : -1;
      });
      panel.setAttribute("aria-labelledby", buttons[index].id);
      panel.replaceChildren();
      defs[index].render(panel);
    }
    select(0);
    return h("div", {}, list, panel);
  }

  // ---------------------------------------------------------------- sign-in
  function showSignIn(message) {
    $("who").textContent = "";
    $("signout").hidden = true;
    const key = h("input", { type: "password", autocomplete: "off", spellcheck: "false" });
    const keyField = field(t("apiKey"), key, t("signInHelp"));
    const form = h("form", { class: "panel", onsubmit: async (event) => {
      event.preventDefault();
      clearFieldError(keyField);
      if (!key.value.trim()) { showFieldError(keyField, t("keyRequired")); return; }
      session.key = key.value.trim();
      try {
        await start();
        sessionStorage.setItem(KEY_STORE, session.key);
      } catch (err) {
        session.key = null;
        showFieldError(keyField, t("error", { message: err.message }));
      }
    } }, keyField, h("div", { class: "actions" }, h("button", { type: "submit" }, t("signIn"))));
    $("main").replaceChildren(h("h2", {}, t("signIn")), form);
    if (message) showFieldError(keyField, message);
    key.focus();
  }
  async function start() {
    session.me = await api("GET", "/v1/me");
    const me = session.me;
    const who = {
      user: t("roleUser", me), admin: t("roleAdmin", me), global_admin: t("roleGlobal", me),
      app: t("roleApp", me),
    }[me.role] || me.role;
    $("who").textContent = t("signedInAs", { who });
    $("signout").hidden = false;
    if (me.role === "admin" || me.role === "global_admin") adminView();
    else if (me.user) userView({ user: me.user, header: null });
    else appKeyView();
  }
  function appKeyView() {
    const input = h("input", { type: "text", autocomplete: "off" });
    const userField = field(t("appKeyUser"), input, t("appKeyHelp"));
    $("main").replaceChildren(h("form", { class: "panel", onsubmit: (event) => {
      event.preventDefault();
      if (input.value.trim()) userView({ user: input.value.trim(), header: input.value.trim() });
    } }, userField, h("div", { class: "actions" }, h("button", { type: "submit" }, t("open")))));
    input.focus();
  }

  // ---------------------------------------------------------------- user view
  function userView(ctx) {
    // ctx.user: whose memory; ctx.header: X-User-Id to send (admin or app key), else null;
    // ctx.admin: opened from the admin view (shows Promote and the way back).
    const as = (opts) => ({ ...opts, user: ctx.header });
    const main = $("main");
    const heading = h("h2", { tabindex: -1 }, t("viewingUser", { user: ctx.user }));
    main.replaceChildren(...[
      ctx.admin ? h("button", { type: "button", class: "quiet", onclick: () => adminView(3) }, t("backToAdmin")) : null,
      heading,
      tabs(t("viewingUser", { user: ctx.user }), [
        { label: t("tabMemories"), render: (p) => memoriesTab(p, ctx, as) },
        { label: t("tabProfile"), render: (p) => profileTab(p, as) },
        { label: t("tabLearning"), render: (p) => learningTab(p, ctx, as) },
      ])].filter(Boolean));
    heading.focus();
  }

  function memoriesTab(panel, ctx, as) {
    const statsBox = h("section", { class: "panel", "aria-labelledby": "stats-h" },
      h("h2", { id: "stats-h" }, t("stats")), h("p", {}, t("loading")));
    const search = h("input", { type: "search", autocomplete: "off" });
    const category = h("select", {}, h("option", { value: "" }, t("allCategories")),
      CATEGORIES.map((c) => h("option", { value: c }, cat(c))));
    const list = h("ul", { class: "cards", "aria-labelledby": "mem-h" });
    const more = h("button", { type: "button", class: "quiet", hidden: true }, t("loadMore"));
    let cursor = null;
    async function load(reset) {
      if (reset) { cursor = null; list.replaceChildren(); }
      try {
        const page = await api("GET", "/v1/memories", as({ query: {
          q: search.value.trim(), category: category.value, limit: 50, after: cursor,
        } }));
        for (const memory of page.data) list.append(memoryCard(memory, ctx, as, () => { load(true); loadStats(); }));
        if (!list.children.length) list.append(h("li", { class: "help" }, t("none")));
        cursor = page.last_id || null;
        more.hidden = !page.has_more || !cursor;
      } catch (err) { failed(err, list); }
    }
    async function loadStats() {
      try {
        const s = await api("GET", "/v1/memories/stats", as());
        const cats = Object.entries(s.by_category || {});
        statsBox.replaceChildren(h("h2", { id: "stats-h" }, t("stats")),
          h("ul", { class: "stats" },
            h("li", {}, h("strong", {}, s.total), t("statTotal")),
            h("li", {}, h("strong", {}, s.enabled), t("statEnabled")),
            h("li", {}, h("strong", {}, s.retired), t("statRetired")),
            h("li", {}, h("strong", {}, when(s.last_learned_at, true)), t("statLastLearned"))),
          h("h3", {}, t("byCategory")),
          cats.length ? bars(cats.map(([c, n]) => [cat(c), n]), t("byCategory")) : h("p", { class: "help" }, t("none")));
      } catch (err) { failed(err, statsBox); }
    }
    more.addEventListener("click", () => load(false));
    const filters = h("form", { class: "row", role: "search", onsubmit: (e) => { e.preventDefault(); load(true); } },
      h("div", { class: "grow" }, field(t("search"), search)),
      h("div", { class: "grow" }, field(t("category"), category)),
      h("button", { type: "submit" }, t("search")));
    category.addEventListener("change", () => load(true));
    panel.append(statsBox, h("h2", { id: "mem-h" }, t("memories")), filters, list, more);
    loadStats();
    load(true);
  }

  function memoryCard(memory, ctx, as, changed) {
    const titleId = nextId("mem");
    const info = h("dl", { class: "facts" },
      h("dt", {}, t("evidence")), h("dd", {}, t("evidenceCount", { n: memory.hits })),
      h("dt", {}, t("firstSeen")), h("dd", {}, when(memory.created_at)),
      h("dt", {}, t("lastSeen")), h("dd", {}, when(memory.last_seen_at)),
      h("dt", {}, t("sourceConversation")), h("dd", {}, memory.source_conversation_id || "—"),
      h("dt", {}, t("source")), h("dd", {}, memory.source),
      memory.tags && memory.tags.length ? [h("dt", {}, t("tags")), h("dd", {}, memory.tags.join(", "))] : null);
    const act = (label, run, cls) => h("button", { type: "button", class: cls || "quiet",
      "aria-describedby": titleId, onclick: async () => {
        try { if (await run() !== false) changed(); } catch (err) { failed(err); }
      } }, label);
    const buttons = [
      act(t("edit"), () => editMemory(memory, `/v1/memories/${encodeURIComponent(memory.id)}`, as)),
      act(memory.enabled ? t("disable") : t("enable"), async () => {
        await api("PATCH", `/v1/memories/${encodeURIComponent(memory.id)}`, as({ body: { enabled: !memory.enabled } }));
        status(t("saved"));
      }),
      act(t("delete"), async () => {
        if (!await confirmAction(t("deleteOne", { title: memory.title }), t("delete"))) return false;
        await api("DELETE", `/v1/memories/${encodeURIComponent(memory.id)}`, as());
        status(t("done"));
        return true;
      }, "danger"),
    ];
    if (ctx.admin) {
      buttons.push(act(t("promote"), async () => {
        if (!await confirmAction(t("promoteOne", { title: memory.title }), t("promote"))) return false;
        await api("POST", `/v1/admin/memories/${encodeURIComponent(memory.id)}/promote`, as());
        status(t("done"));
        return true;
      }));
    }
    return h("li", { class: memory.enabled ? "card" : "card off" },
      h("h3", { id: titleId }, memory.title),
      h("p", {}, h("span", { class: "badge" }, cat(memory.category)),
        memory.subcategory ? h("span", { class: "badge" }, memory.subcategory) : null,
        memory.enabled ? null : h("span", { class: "badge" }, t("disabled"))),
      h("p", {}, memory.content),
      h("details", {}, h("summary", {}, t("details")), info),
      h("div", { class: "actions" }, buttons));
  }

  async function editMemory(memory, path, as) {
    const title = field(t("memTitle"), h("input", { type: "text", value: memory.title }));
    const content = field(t("content"), h("textarea", { value: memory.content }));
    const category = field(t("category"), h("select", {}, CATEGORIES.map((c) =>
      h("option", { value: c, selected: c === memory.category }, cat(c)))));
    const tags = field(t("tags"), h("input", { type: "text", value: (memory.tags || []).join(", ") }));
    const fields = { title, content, category, tags };
    const saved = await openDialog(t("editMemory"), h("div", {}, title, content, category, tags), [
      { label: t("cancel"), class: "quiet", value: false },
      { label: t("save"), run: async () => {
        Object.values(fields).forEach(clearFieldError);
        try {
          await api("PATCH", path, as({ body: {
            title: title.control.value, content: content.control.value,
            category: category.control.value,
            tags: tags.control.value.split(",").map((s) => s.trim()).filter(Boolean),
          } }));
          return true;
        } catch (err) {
          showFieldError(fields[err.param] || content, err.message);
          return undefined;
        }
      } },
    ]);
    if (saved) status(t("saved"));
    return Boolean(saved);
  }

  function profileTab(panel, as) {
    const box = h("div", {}, h("p", {}, t("loading")));
    panel.append(box);
    Promise.all([
      api("GET", "/v1/profile", as()),
      api("GET", "/v1/memories", as({ query: { include_retired: "true", limit: 200 } })),
    ]).then(([profile, all]) => {
      const scored = (items, label) => items && items.length
        ? bars(items.map((x) => [`${x.text} (${t("hits")} ${x.hits})`,
          Number(x.effective_score ?? x.score).toFixed(2)]), label, 1)
        : h("p", { class: "help" }, t("none"));
      const retired = all.data.filter((m) => m.superseded_at);
      box.replaceChildren(
        h("section", { class: "panel", "aria-labelledby": "prof-h" },
          h("h2", { id: "prof-h" }, t("profile")),
          h("dl", { class: "facts" },
            h("dt", {}, t("names")), h("dd", {}, (profile.names || []).join(", ") || "—"),
            h("dt", {}, t("firstSeen")), h("dd", {}, when(profile.first_seen)),
            h("dt", {}, t("lastSeen")), h("dd", {}, when(profile.last_seen)),
            h("dt", {}, t("messages")), h("dd", {}, profile.message_count ?? 0),
            h("dt", {}, t("style")), h("dd", {}, profile.style || "—"),
            h("dt", {}, t("impression")), h("dd", {}, profile.impression || "—"))),
        h("section", { class: "panel", "aria-labelledby": "traits-h" },
          h("h2", { id: "traits-h" }, t("traits")), scored(profile.traits, t("traits")),
          h("h2", {}, t("topics")), scored(profile.topics, t("topics"))),
        h("section", { class: "panel", "aria-labelledby": "facts-h" },
          h("h2", { id: "facts-h" }, t("facts")), factList(profile.facts || [])),
        h("section", { class: "panel", "aria-labelledby": "arch-h" },
          h("h2", { id: "arch-h" }, t("archive")),
          retired.length ? h("ul", { class: "cards" }, retired.map((m) => h("li", { class: "card off" },
            h("h3", {}, m.title), h("p", {}, m.content),
            h("p", { class: "help" }, t("retiredOn", { at: when(m.superseded_at) }), " · ",
              `${t("reason")}: ${m.supersede_reason || "—"}`)))) : h("p", { class: "help" }, t("none"))));
    }).catch((err) => failed(err, box));
  }

  function factList(facts) {
    if (!facts.length) return h("p", { class: "help" }, t("none"));
    return h("ul", { class: "cards" }, facts.map((f) => {
      const events = Array.isArray(f.timeline) ? f.timeline : [];
      return h("li", { class: "card" },
        h("h3", {}, f.title || f.content || f.text),
        f.title && f.content ? h("p", {}, f.content) : null,
        h("p", { class: "help" }, `${t("evidence")}: ${t("evidenceCount", { n: f.hits ?? 1 })}`),
        h("ol", { class: "timeline", "aria-label": t("lastSeen") },
          events.length ? events.map((e) => h("li", {}, `${when(e.at || e.date)} · ${e.action || e.event || e.kind || ""}`))
            : [h("li", {}, `${t("firstSeen")}: ${when(f.first_seen || f.created_at)}`),
              h("li", {}, `${t("lastSeen")}: ${when(f.last_seen || f.last_seen_at)}`)]));
    }));
  }

  function learningTab(panel, ctx, as) {
    const switches = h("section", { class: "panel", "aria-labelledby": "learn-h" },
      h("h2", { id: "learn-h" }, t("learning")), h("p", {}, t("loading")));
    async function loadSettings() {
      try {
        const [settings, me] = await Promise.all([api("GET", "/v1/settings", as()), api("GET", "/v1/me", as())]);
        const save = (name) => async (event) => {
          const box = event.target;
          box.disabled = true;
          try {
            await api("PATCH", "/v1/settings", as({ body: { [name]: box.checked } }));
            status(t("saved"));
            await loadSettings();
          } catch (err) { box.checked = !box.checked; box.disabled = false; failed(err); }
        };
        const l = me.learning || {};
        switches.replaceChildren(h("h2", { id: "learn-h" }, t("learning")),
          checkbox(t("personalLearning"), settings.personal_learning, save("personal_learning")),
          checkbox(t("indicator"), settings.learning_indicator, save("learning_indicator")),
          h("p", { class: "help" }, t("learningEffective", {
            state: t(l.effective ? "on" : "off"), global: t(l.global ? "on" : "off"),
            personal: t(l.personal ? "on" : "off") })));
      } catch (err) { failed(err, switches); }
    }
    const download = (format) => async () => {
      try {
        const response = await api("GET", "/v1/memories/export", as({ query: { format }, raw: true }));
        const blob = await response.blob();
        const link = h("a", { href: URL.createObjectURL(blob),
          download: `memories-${ctx.user}.${format === "json" ? "json" : "md"}` });
        document.body.append(link);
        link.click();
        link.remove();
        setTimeout(() => URL.revokeObjectURL(link.href), 10000);
      } catch (err) { failed(err); }
    };
    const file = h("input", { type: "file", accept: ".json,application/json" });
    const fileField = field(t("importFile"), file);
    const importResult = h("p", { class: "help", "aria-live": "polite" });
    const data = h("section", { class: "panel", "aria-labelledby": "data-h" },
      h("h2", { id: "data-h" }, t("exportImport")),
      h("div", { class: "actions" },
        h("button", { type: "button", onclick: download("json") }, t("exportJson")),
        h("button", { type: "button", onclick: download("markdown") }, t("exportMarkdown"))),
      h("form", { onsubmit: async (event) => {
        event.preventDefault();
        clearFieldError(fileField);
        if (!file.files.length) { showFieldError(fileField, t("importFile")); return; }
        try {
          const text = await file.files[0].text();
          const result = await api("POST", "/v1/memories/import", as({ body: text }));
          importResult.textContent = t("importResult", { imported: result.imported,
            merged: result.merged, rejected: (result.rejected || []).length });
        } catch (err) { showFieldError(fileField, err.message); }
      } }, fileField, h("div", { class: "actions" }, h("button", { type: "submit" }, t("import")))),
      importResult);
    const erase = h("section", { class: "panel", "aria-labelledby": "erase-h" },
      h("h2", { id: "erase-h" }, t("dangerZone")),
      h("p", { class: "help" }, t("clearAllHelp")),
      h("button", { type: "button", class: "danger", onclick: async () => {
        if (!await confirmAction(t("clearAllConfirm", { user: ctx.user }), t("clearAll"))) return;
        try {
          const result = await api("DELETE", "/v1/memories", as({ query: { confirm: "true" } }));
          status(t("cleared", { n: result.deleted }));
        } catch (err) { failed(err); }
      } }, t("clearAll")),
      h("p", { class: "help" }, t("forgetMeHelp")),
      h("button", { type: "button", class: "danger", onclick: async () => {
        if (!await confirmAction(t("forgetMeConfirm", { user: ctx.user }), t("forgetMe"))) return;
        try {
          await api("DELETE", "/v1/me", as({ query: { confirm: "true" } }));
          status(t("erased", { user: ctx.user }));
          if (ctx.admin) adminView(3); else userView(ctx);
        } catch (err) { failed(err); }
      } }, t("forgetMe")));
    panel.append(switches, data, erase);
    loadSettings();
  }

  // ---------------------------------------------------------------- admin view
  function adminView(tabIndex) {
    // A global admin key has no tenant: it manages system memories and reads one
    // tenant's stats and usage at a time (?tenant=, named in the field above the tabs).
    const global = session.me.role === "global_admin";
    const heading = h("h2", { tabindex: -1 }, global ? t("roleGlobal") : t("roleAdmin", session.me));
    const defs = global ? [
      { label: t("tabOverview"), render: overviewTab },
      { label: t("tabShared"), render: sharedTab },
      { label: t("tabUsage"), render: usageTab },
      { label: t("tabDead"), render: deadTab },
    ] : [
      { label: t("tabOverview"), render: overviewTab },
      { label: t("tabPrompts"), render: promptsTab },
      { label: t("tabShared"), render: sharedTab },
      { label: t("tabUsers"), render: usersTab },
      { label: t("tabSettings"), render: settingsTab },
      { label: t("tabUsage"), render: usageTab },
      { label: t("tabDead"), render: deadTab },
    ];
    let view = tabs(t("title"), defs);
    let tenantForm = null;
    if (global) {
      const input = h("input", { type: "text", autocomplete: "off", value: session.tenant || "" });
      tenantForm = h("form", { class: "row", onsubmit: (event) => {
        event.preventDefault();
        session.tenant = input.value.trim();
        const fresh = tabs(t("title"), defs);
        view.replaceWith(fresh);
        view = fresh;
      } }, h("div", { class: "grow" }, field(t("tenant"), input, t("tenantHelp"))),
      h("button", { type: "submit" }, t("open")));
    }
    $("main").replaceChildren(...[heading, tenantForm, view].filter(Boolean));
    if (tabIndex) view.querySelectorAll("[role=tab]")[tabIndex].click();
    heading.focus();
  }
  // Query parameters of the tenant-reading admin routes (stats, usage).
  const tenantQuery = (query) => (session.me.role === "global_admin" ? { ...query, tenant: session.tenant } : query);

  function dl(pairs) {
    return h("dl", { class: "facts" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  function trendChart(daily, days) {
    // One bar per day (learned memories); a table of every column follows for screen readers.
    const width = 600, height = 150, gap = 2;
    const max = Math.max(1, ...daily.map((d) => d.learned || 0));
    const step = width / Math.max(1, daily.length);
    const total = daily.reduce((sum, d) => sum + (d.learned || 0), 0);
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("class", "chart");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", t("trendLabel", { days, total }));
    daily.forEach((d, i) => {
      const rect = document.createElementNS(ns, "rect");
      const barHeight = Math.max(1, ((d.learned || 0) / max) * (height - 10));
      rect.setAttribute("x", String(i * step + gap / 2));
      rect.setAttribute("y", String(height - barHeight));
      rect.setAttribute("width", String(Math.max(1, step - gap)));
      rect.setAttribute("height", String(barHeight));
      const title = document.createElementNS(ns, "title");
      title.textContent = `${d.date}: ${d.learned || 0}`;
      rect.append(title);
      svg.append(rect);
    });
    return svg;
  }

  function overviewTab(panel) {
    const stats = h("section", { class: "panel", "aria-labelledby": "tot-h" },
      h("h2", { id: "tot-h" }, t("totals")), h("p", {}, t("loading")));
    api("GET", "/v1/admin/stats", { query: tenantQuery({ days: 30 }) }).then((s) => {
      const daily = s.daily || [];
      const totals = s.totals || {};
      const scopes = totals.memories || {};
      const count = (scope) => (scopes[scope] && scopes[scope].total) || 0;
      const categories = {};
      for (const counts of Object.values(scopes)) {
        for (const [name, n] of Object.entries(counts)) {
          if (!["total", "retired", "disabled"].includes(name)) categories[name] = (categories[name] || 0) + n;
        }
      }
      const learning = s.learning || {};
      const budget = learning.budget || {};
      const caps = budget.budget || {};
      const spent = (n, cap) => (cap ? t("ofCap", { spent: n ?? 0, cap }) : t("noCap", { spent: n ?? 0 }));
      stats.replaceChildren(h("h2", { id: "tot-h" }, t("totals")),
        h("ul", { class: "stats" },
          h("li", {}, h("strong", {}, totals.users ?? 0), t("users")),
          h("li", {}, h("strong", {}, count("personal")), t("scopePersonal")),
          h("li", {}, h("strong", {}, count("shared")), t("scopeShared")),
          h("li", {}, h("strong", {}, count("system")), t("scopeSystem")),
          h("li", {}, h("strong", {}, totals.retired ?? 0), t("retired"))),
        h("h3", {}, t("byCategory")),
        Object.keys(categories).length ? bars(Object.entries(categories).map(([c, n]) => [cat(c), n]), t("byCategory"))
          : h("p", { class: "help" }, t("none")),
        h("h3", {}, t("budget")),
        dl([
          [t("learning"), t(learning.enabled ? "on" : "off")],
          [t("budgetState"), budget.state ? `${t(budget.state)}${budget.paused_by ? ` (${budget.paused_by})` : ""}` : "—"],
          [t("spentToday"), spent(budget.spent_today, caps.tokens_per_day)],
          [t("spentMonth"), spent(budget.spent_this_month, caps.tokens_per_month)],
          budget.resumes_at ? [t("resumesAt"), when(budget.resumes_at)] : null,
        ].filter(Boolean)),
        h("h3", {}, t("trend")), trendChart(daily, 30),
        h("details", {}, h("summary", {}, t("trend")),
          table([t("date"), t("learned"), t("merged"), t("retired"), t("rejected"),
            t("learningTokens"), t("userTokens"), t("activeUsers")],
          daily.map((d) => [d.date, d.learned, d.merged, d.retired, d.rejected,
            d.learning_tokens, d.user_tokens, d.active_users]), t("trend"))));
    }).catch((err) => failed(err, stats));
    panel.append(...[stats, session.me.role === "global_admin" ? null : auditLog()].filter(Boolean));
  }

  function auditLog() {
    const select = (values) => h("select", {}, h("option", { value: "" }, t("any")),
      values.map((v) => h("option", { value: v }, v)));
    const f = {
      user: field(t("user"), h("input", { type: "text", autocomplete: "off" })),
      action: field(t("action"), select(AUDIT_ACTIONS)),
      actor: field(t("actor"), select(AUDIT_ACTORS)),
      conversation: field(t("conversation"), h("input", { type: "text", autocomplete: "off" })),
      since: field(t("since"), h("input", { type: "date" })),
      until: field(t("until"), h("input", { type: "date" })),
    };
    const rows = h("div", {});
    const more = h("button", { type: "button", class: "quiet", hidden: true }, t("loadMore"));
    let seen = [];
    let before = null;
    async function load(reset) {
      if (reset) { seen = []; before = null; }
      const query = { limit: 50, before };
      for (const [name, wrap] of Object.entries(f)) {
        clearFieldError(wrap);
        query[name] = wrap.control.value;
      }
      if (query.since) query.since = `${query.since}T00:00:00Z`;
      if (query.until) query.until = `${query.until}T23:59:59Z`;
      try {
        const page = await api("GET", "/v1/admin/audit", { query });
        seen = seen.concat(page.data);
        before = page.data.length ? page.data[page.data.length - 1].id : null;
        more.hidden = page.data.length < 50;
        rows.replaceChildren(seen.length ? table(
          [t("at"), t("user"), t("action"), t("actor"), t("reason"), t("memory")],
          seen.map((e) => [when(e.at), e.user_id || "—", e.action, e.actor, e.reason || "",
            e.memory_id || ""]), t("learningLog")) : h("p", { class: "help" }, t("none")));
      } catch (err) {
        if (f[err.param]) showFieldError(f[err.param], err.message); else failed(err, rows);
      }
    }
    more.addEventListener("click", () => load(false));
    load(true);
    return h("section", { class: "panel", "aria-labelledby": "log-h" },
      h("h2", { id: "log-h" }, t("learningLog")),
      h("form", { "aria-label": t("filters"), onsubmit: (e) => { e.preventDefault(); load(true); } },
        h("div", { class: "row" }, Object.values(f).map((w) => h("div", { class: "grow" }, w)),
          h("button", { type: "submit" }, t("apply")))),
      rows, more);
  }

  function promptsTab(panel) {
    for (const kind of ["scoring", "extraction"]) {
      const box = h("section", { class: "panel", "aria-labelledby": `p-${kind}` },
        h("h2", { id: `p-${kind}` }, t("prompt", { kind })), h("p", {}, t("loading")));
      panel.append(box);
      const load = async () => {
        try {
          const [current, versions] = await Promise.all([
            api("GET", `/v1/admin/prompts/${kind}`),
            api("GET", `/v1/admin/prompts/${kind}/versions`),
          ]);
          const text = field(t("prompt", { kind }), h("textarea", { value: current.text, rows: 10 }),
            t("promptSource", { source: current.source }));
          const list = versions.data || versions.versions || [];
          box.replaceChildren(h("h2", { id: `p-${kind}` }, t("prompt", { kind })),
            h("form", { onsubmit: async (event) => {
              event.preventDefault();
              clearFieldError(text);
              try {
                await api("PUT", `/v1/admin/prompts/${kind}`, { body: { text: text.control.value } });
                status(t("saved"));
                await load();
              } catch (err) { showFieldError(text, err.message); }
            } }, text, h("div", { class: "actions" }, h("button", { type: "submit" }, t("save")))),
            h("h3", {}, t("versions")),
            list.length ? h("ul", { class: "cards" }, list.map((v) => {
              const label = t("version", { version: v.version, actor: v.actor, at: when(v.at) });
              const labelId = nextId("ver");
              return h("li", { class: "card" },
                h("p", { id: labelId }, h("strong", {}, label)),
                h("details", {}, h("summary", {}, t("details")), h("pre", { class: "help" }, v.text || "—")),
                h("div", { class: "actions" }, h("button", { type: "button", class: "quiet",
                  "aria-describedby": labelId, onclick: async () => {
                    if (!await confirmAction(t("restoreConfirm", { kind, version: v.version }), t("restore"))) return;
                    try {
                      await api("POST", `/v1/admin/prompts/${kind}/versions/${v.version}/restore`);
                      status(t("done"));
                      await load();
                    } catch (err) { failed(err); }
                  } }, t("restore"))));
            })) : h("p", { class: "help" }, t("none")));
        } catch (err) { failed(err, box); }
      };
      load();
    }
  }

  function sharedTab(panel) {
    const scopes = session.me.role === "global_admin" ? ["system"] : ["shared", "system"];
    for (const scope of scopes) {
      const title = scope === "shared" ? t("sharedMemories") : t("systemMemories");
      const hid = nextId("scope");
      const list = h("ul", { class: "cards" });
      const content = field(t("content"), h("textarea", { rows: 3 }));
      const memTitle = field(t("memTitle"), h("input", { type: "text" }));
      const category = field(t("category"), h("select", {}, CATEGORIES.map((c) =>
        h("option", { value: c, selected: c === "organizational" }, cat(c)))));
      const fields = { content, title: memTitle, category };
      const load = async () => {
        try {
          const page = await api("GET", "/v1/admin/memories", { query: { scope, limit: 200 } });
          list.replaceChildren(...(page.data.length ? page.data.map((m) => adminMemoryCard(m, load))
            : [h("li", { class: "help" }, t("none"))]));
        } catch (err) { failed(err, list); }
      };
      panel.append(h("section", { class: "panel", "aria-labelledby": hid },
        h("h2", { id: hid }, title), list,
        h("h3", {}, t("addMemory")),
        h("form", { onsubmit: async (event) => {
          event.preventDefault();
          Object.values(fields).forEach(clearFieldError);
          try {
            await api("POST", "/v1/admin/memories", { query: { scope }, body: {
              content: content.control.value, title: memTitle.control.value,
              category: category.control.value } });
            content.control.value = "";
            memTitle.control.value = "";
            status(t("saved"));
            await load();
          } catch (err) { showFieldError(fields[err.param] || content, err.message); }
        } }, content, memTitle, category, h("div", { class: "actions" }, h("button", { type: "submit" }, t("add"))))));
      load();
    }
  }

  function adminMemoryCard(memory, reload) {
    const titleId = nextId("mem");
    const path = `/v1/admin/memories/${encodeURIComponent(memory.id)}`;
    const act = (label, run, cls) => h("button", { type: "button", class: cls || "quiet",
      "aria-describedby": titleId, onclick: async () => {
        try { if (await run() !== false) await reload(); } catch (err) { failed(err); }
      } }, label);
    return h("li", { class: memory.enabled === false ? "card off" : "card" },
      h("h3", { id: titleId }, memory.title),
      h("p", {}, h("span", { class: "badge" }, memory.scope), h("span", { class: "badge" }, cat(memory.category))),
      h("p", {}, memory.content),
      h("details", {}, h("summary", {}, t("details")), h("dl", { class: "facts" },
        h("dt", {}, t("source")), h("dd", {}, memory.source || "—"),
        h("dt", {}, t("firstSeen")), h("dd", {}, when(memory.created_at)),
        h("dt", {}, t("lastSeen")), h("dd", {}, when(memory.last_seen_at)))),
      h("div", { class: "actions" },
        act(t("edit"), () => editMemory(memory, path, (o) => o || {})),
        act(t("delete"), async () => {
          if (!await confirmAction(t("deleteOne", { title: memory.title }), t("delete"))) return false;
          await api("DELETE", path);
          status(t("done"));
          return true;
        }, "danger")));
  }

  function usersTab(panel) {
    const rows = h("div", {}, h("p", {}, t("loading")));
    const more = h("button", { type: "button", class: "quiet", hidden: true }, t("loadMore"));
    let seen = [];
    let after = null;
    async function load() {
      try {
        const page = await api("GET", "/v1/admin/users", { query: { limit: 50, after } });
        seen = seen.concat(page.data);
        after = page.last_id || null;
        more.hidden = !page.has_more;
        rows.replaceChildren(seen.length ? table([t("user"), t("memories"), t("lastSeenCol"), ""],
          seen.map((u) => [u.user, u.memories, when(u.last_seen),
            h("button", { type: "button", class: "quiet", "aria-label": `${t("open")} ${u.user}`,
              onclick: () => userView({ user: u.user, header: u.user, admin: true }) }, t("open"))]),
          t("users")) : h("p", { class: "help" }, t("none")));
      } catch (err) { failed(err, rows); }
    }
    more.addEventListener("click", load);
    const input = h("input", { type: "text", autocomplete: "off" });
    panel.append(h("section", { class: "panel", "aria-labelledby": "users-h" },
      h("h2", { id: "users-h" }, t("users")), rows, more,
      h("form", { class: "row", onsubmit: (e) => {
        e.preventDefault();
        const user = input.value.trim();
        if (user) userView({ user, header: user, admin: true });
      } }, h("div", { class: "grow" }, field(t("appKeyUser"), input)),
      h("button", { type: "submit" }, t("open")))));
    load();
  }

  function lookup(obj, dotted) {
    // Settings are keyed by config name ("learning.score_threshold"); a nested value
    // ("learning.budget" → tokens_per_day) is read below the longest name present.
    const parts = dotted.split(".");
    for (let i = parts.length; i > 0; i -= 1) {
      const name = parts.slice(0, i).join(".");
      if (obj && Object.prototype.hasOwnProperty.call(obj, name)) {
        return parts.slice(i).reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), obj[name]);
      }
    }
    return undefined;
  }

  function settingsTab(panel) {
    const box = h("section", { class: "panel", "aria-labelledby": "set-h" },
      h("h2", { id: "set-h" }, t("settings")), h("p", {}, t("loading")));
    panel.append(box);
    const load = async () => {
      try {
        const answer = await api("GET", "/v1/admin/settings");
        const current = answer.settings || answer;
        const wraps = {};
        const initial = {};
        const kinds = {};
        for (const [name, declared] of SETTINGS) {
          const value = lookup(current, name);
          // A structured value (e.g. batch_messages per channel) is edited as JSON.
          const type = value && typeof value === "object" ? "json" : declared;
          kinds[name] = type;
          initial[name] = type === "json" ? JSON.stringify(value) : value;
          if (type === "bool") {
            const control = h("input", { type: "checkbox", checked: Boolean(value), id: nextId("f") });
            const error = h("p", { class: "field-error", id: nextId("err"), hidden: true });
            const wrap = h("div", { class: "field" },
              h("label", { class: "check", for: control.id }, control, h("span", {}, t(`set.${name}`))), error);
            wrap.control = control;
            wrap.error = error;
            wraps[name] = wrap;
          } else {
            const attrs = type === "text" || type === "json" ? { type: "text" } : { type: "number",
              step: type === "float" ? "any" : "1", inputmode: type === "float" ? "decimal" : "numeric" };
            wraps[name] = field(t(`set.${name}`), h("input", { ...attrs, value: initial[name] ?? "" }));
          }
        }
        box.replaceChildren(h("h2", { id: "set-h" }, t("settings")), h("p", { class: "help" }, t("settingsHelp")),
          h("form", { novalidate: true, onsubmit: async (event) => {
            event.preventDefault();
            const patch = {};
            const values = {};
            for (const [name] of SETTINGS) {
              const type = kinds[name];
              const wrap = wraps[name];
              clearFieldError(wrap);
              let value;
              if (type === "bool") value = wrap.control.checked;
              else if (type === "text" || type === "json") value = wrap.control.value;
              else if (wrap.control.value.trim() === "") value = type === "int?" ? null : "";
              else value = Number(wrap.control.value);
              values[name] = value;
              const before = initial[name] ?? (type === "int?" ? null : "");
              if (value === before) continue;
              // A budget is sent whole (PATCH replaces it); other settings one by one.
              if (name.startsWith("learning.budget.")) patch["learning.budget"] = null;
              else if (type === "json") {
                try { patch[name] = JSON.parse(value); } catch (_) { patch[name] = value; }
              } else patch[name] = value;
            }
            if ("learning.budget" in patch) {
              patch["learning.budget"] = {
                tokens_per_day: values["learning.budget.tokens_per_day"],
                tokens_per_month: values["learning.budget.tokens_per_month"],
              };
            }
            if (!Object.keys(patch).length) { status(t("saved")); return; }
            try {
              await api("PATCH", "/v1/admin/settings", { body: patch });
              status(t("saved"));
              await load();
            } catch (err) {
              // param is the dotted path of the bad value: learning.budget.tokens_per_day,
              // learning.batch_messages.private (shown at learning.batch_messages).
              const owner = Object.keys(wraps).find((n) => String(err.param || "").startsWith(`${n}.`));
              const target = wraps[err.param] || wraps[`${err.param}.tokens_per_day`] || wraps[owner];
              if (target) showFieldError(target, err.message);
              else failed(err);
            }
          } }, SETTINGS.map(([name]) => wraps[name]),
          h("div", { class: "actions" }, h("button", { type: "submit" }, t("save")))));
      } catch (err) { failed(err, box); }
    };
    load();
  }

  function usageTab(panel) {
    const group = h("select", {}, ["day", "model", "user"].map((g) =>
      h("option", { value: g }, t(g === "user" ? "user" : g))));
    const rows = h("div", {}, h("p", {}, t("loading")));
    const sum = (o) => Object.values(o || {}).reduce((a, b) => a + (Number(b) || 0), 0);
    async function load() {
      try {
        const page = await api("GET", "/v1/admin/usage", { query: tenantQuery({ group_by: group.value }) });
        rows.replaceChildren(page.data.length ? table(
          [t("key"), t("requests"), `${t("userTokens")} (${t("promptTokens")})`,
            `${t("userTokens")} (${t("completionTokens")})`, t("memoryTokens"), t("learningTokens")],
          page.data.map((r) => [r.key, r.requests, r.user_tokens.prompt, r.user_tokens.completion,
            r.memory_tokens, `${sum(r.learning_tokens)} (${Object.entries(r.learning_tokens || {})
              .filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ")})`]), t("usage"))
          : h("p", { class: "help" }, t("none")));
      } catch (err) { failed(err, rows); }
    }
    group.addEventListener("change", load);
    panel.append(h("section", { class: "panel", "aria-labelledby": "use-h" },
      h("h2", { id: "use-h" }, t("usage")), field(t("groupBy"), group), rows));
    load();
  }

  function deadTab(panel) {
    const rows = h("div", {}, h("p", {}, t("loading")));
    async function load() {
      try {
        const page = await api("GET", "/v1/admin/dead-letters");
        const path = (d) => `/v1/admin/dead-letters/${encodeURIComponent(d.id)}`;
        rows.replaceChildren(page.data.length ? table(
          [t("kind"), t("attempts"), t("lastError"), t("failedAt"), ""],
          page.data.map((d) => [d.kind, d.attempts, d.last_error, when(d.failed_at), h("div", { class: "actions" },
            h("button", { type: "button", class: "quiet", "aria-label": `${t("requeue")} ${d.id}`, onclick: async () => {
              try { await api("POST", `${path(d)}/requeue`); status(t("done")); await load(); } catch (err) { failed(err); }
            } }, t("requeue")),
            h("button", { type: "button", class: "danger", "aria-label": `${t("drop")} ${d.id}`, onclick: async () => {
              if (!await confirmAction(t("dropConfirm", { id: d.id }), t("drop"))) return;
              try { await api("DELETE", path(d)); status(t("done")); await load(); } catch (err) { failed(err); }
            } }, t("drop")))]), t("deadLetters")) : h("p", { class: "help" }, t("none")));
      } catch (err) { failed(err, rows); }
    }
    panel.append(h("section", { class: "panel", "aria-labelledby": "dead-h" },
      h("h2", { id: "dead-h" }, t("deadLetters")), rows));
    load();
  }

  // ---------------------------------------------------------------- boot
  document.documentElement.lang = LANG === "zh" ? "zh-CN" : "en";
  document.title = t("title");
  for (const el of document.querySelectorAll("[data-t]")) el.textContent = t(el.dataset.t);
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORE);
    session.key = null;
    session.me = null;
    showSignIn();
  });
  const stored = sessionStorage.getItem(KEY_STORE);
  if (stored) {
    session.key = stored;
    start().catch((err) => { sessionStorage.removeItem(KEY_STORE); session.key = null; showSignIn(err.message); });
  } else {
    showSignIn();
  }
})();
