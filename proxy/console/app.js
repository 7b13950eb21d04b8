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
  // A text with a count: "{key}.one" / "{key}.other" by the language's plural rule
  // (Chinese has only "other"); {n} is the count.
  const PLURALS = new Intl.PluralRules(LANG === "zh" ? "zh-CN" : "en-US");
  function tn(key, n, vars) {
    const form = `${key}.${PLURALS.select(Number(n) || 0)}`;
    const chosen = (TEXT[LANG] && TEXT[LANG][form]) || TEXT.en[form] ? form : `${key}.other`;
    return t(chosen, { ...vars, n });
  }
  // A category's label; an unknown one (a newer gateway) is shown as the API names it.
  const cat = (name) => (TEXT.en[`cat.${name}`] ? t(`cat.${name}`) : name);
  // A preset subcategory's label; a free-form one is shown as written.
  const subcat = (name) => (TEXT.en[`sub.${name}`] ? t(`sub.${name}`) : name);
  // Epoch seconds (the queue's times) as the Date that when() reads.
  const fromEpoch = (seconds) => (seconds ? new Date(Number(seconds) * 1000) : null);
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
  function clearStatus() {
    // An error belongs to the place it happened: leaving it drops the error (a success
    // message, like "Everything about bob was erased.", stays for its few seconds).
    const box = $("status");
    if (!box.classList.contains("bad")) return;
    clearTimeout(status.timer);
    box.className = "status";
    box.textContent = "";
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
      clearStatus();  // a message of the tab left behind is stale here
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
      ctx.admin ? h("button", { type: "button", class: "quiet", onclick: () => adminView(ctx.back ?? 3) }, t("backToAdmin")) : null,
      heading,
      tabs(t("viewingUser", { user: ctx.user }), [
        { label: t("tabMemories"), render: (p) => memoriesTab(p, ctx, as) },
        { label: t("tabProfile"), render: (p) => profileTab(p, as) },
        { label: t("tabConflicts"), render: (p) => conflictsTab(p, ctx, as) },
        { label: t("tabLearning"), render: (p) => learningTab(p, ctx, as) },
        { label: t("tabRecall"), render: (p) => recallTab(p, as) },
      ])].filter(Boolean));
    heading.focus();
  }

  // Orders of the memory cards (over the memories loaded so far). "match" keeps the
  // server's order: a search's results come best match first (ranked as chat recall).
  const SORTS = {
    match: () => 0,
    newest: (a, b) => String(b.created_at || "").localeCompare(String(a.created_at || "")),
    oldest: (a, b) => String(a.created_at || "").localeCompare(String(b.created_at || "")),
    evidence: (a, b) => (Number(b.hits) || 0) - (Number(a.hits) || 0) || SORTS.newest(a, b),
  };

  function memoriesTab(panel, ctx, as) {
    const statsBox = h("section", { class: "panel", "aria-labelledby": "stats-h" },
      h("h2", { id: "stats-h" }, t("stats")), h("p", {}, t("loading")));
    const search = h("input", { type: "search", autocomplete: "off" });
    const category = h("select", {}, h("option", { value: "" }, t("allCategories")),
      CATEGORIES.map((c) => h("option", { value: c }, cat(c))));
    const sort = h("select", {}, Object.keys(SORTS).map((k) => h("option", { value: k }, t(`sort.${k}`))));
    const matchOption = sort.querySelector('option[value="match"]');
    sort.value = "newest";
    const list = h("ul", { class: "cards", "aria-labelledby": "mem-h" });
    const more = h("button", { type: "button", class: "quiet", hidden: true }, t("loadMore"));
    const selected = new Set();
    const selectedCount = h("span", { "aria-live": "polite" }, tn("selectedCount", 0));
    const bulkDelete = h("button", { type: "button", class: "danger", disabled: true }, t("deleteSelected"));
    const selectAll = h("input", { type: "checkbox" });
    let loaded = [];
    let cursor = null;
    const refresh = () => { load(true); loadStats(); };
    function selectionChanged() {
      selectedCount.textContent = tn("selectedCount", selected.size);
      bulkDelete.disabled = selected.size === 0;
      selectAll.checked = loaded.length > 0 && selected.size === loaded.length;
    }
    function render() {
      const ordered = [...loaded].sort(SORTS[sort.value]);
      list.replaceChildren(...(ordered.length ? ordered.map((memory) => memoryCard(memory, ctx, as, refresh, {
        selected: selected.has(memory.id),
        onselect: (on) => { if (on) selected.add(memory.id); else selected.delete(memory.id); selectionChanged(); },
      })) : [h("li", { class: "help" }, t("none"))]));
      if (ctx.focus) {
        const target = list.querySelector(`[data-memory-id="${CSS.escape(ctx.focus)}"]`);
        if (target) {
          target.classList.add("focus");
          target.scrollIntoView({ block: "center" });
          target.querySelector("h3").focus();
          ctx.focus = null;
        }
      }
      selectionChanged();
    }
    async function load(reset) {
      if (reset) {
        cursor = null; loaded = []; selected.clear();
        // A search shows best match first; the plain listing newest first.
        const searching = Boolean(search.value.trim());
        matchOption.disabled = !searching;
        if (searching) sort.value = "match";
        else if (sort.value === "match") sort.value = "newest";
      }
      try {
        const page = await api("GET", "/v1/memories", as({ query: {
          q: search.value.trim(), category: category.value, limit: 50, after: cursor,
        } }));
        loaded = loaded.concat(page.data);
        cursor = page.last_id || null;
        more.hidden = !page.has_more || !cursor;
        render();
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
    sort.addEventListener("change", render);
    selectAll.addEventListener("change", () => {
      for (const memory of loaded) { if (selectAll.checked) selected.add(memory.id); else selected.delete(memory.id); }
      render();
    });
    bulkDelete.addEventListener("click", async () => {
      const ids = [...selected];
      if (!ids.length || !await confirmAction(tn("deleteMany", ids.length), t("delete"))) return;
      let deleted = 0;
      try {
        for (const id of ids) {
          await api("DELETE", `/v1/memories/${encodeURIComponent(id)}`, as());
          deleted += 1;
        }
        status(tn("cleared", deleted));
      } catch (err) { failed(err); }
      refresh();
    });
    const filters = h("form", { class: "row", role: "search", onsubmit: (e) => { e.preventDefault(); load(true); } },
      h("div", { class: "grow" }, field(t("search"), search)),
      h("div", { class: "grow" }, field(t("category"), category)),
      h("button", { type: "submit" }, t("search")));
    category.addEventListener("change", () => load(true));
    const bulk = h("div", { class: "row bulk" },
      h("div", { class: "grow" }, field(t("sortBy"), sort)),
      h("label", { class: "check" }, selectAll, h("span", {}, t("selectAll"))),
      selectedCount, bulkDelete);
    panel.append(statsBox, h("h2", { id: "mem-h" }, t("memories")), filters, bulk, list, more);
    loadStats();
    load(true);
  }

  function memoryCard(memory, ctx, as, changed, pick) {
    const titleId = nextId("mem");
    const info = h("dl", { class: "facts" },
      h("dt", {}, t("evidence")), h("dd", {}, tn("evidenceCount", memory.hits)),
      h("dt", {}, t("firstSeen")), h("dd", {}, when(memory.created_at)),
      h("dt", {}, t("lastSeen")), h("dd", {}, when(memory.last_seen_at)),
      h("dt", {}, t("sourceConversation")), h("dd", {}, memory.source_conversation_id || "—"),
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
    const select = pick ? h("label", { class: "check pick" }, h("input", { type: "checkbox",
      checked: pick.selected, onchange: (event) => pick.onselect(event.target.checked) }),
    h("span", { class: "visually-hidden" }, t("selectOne", { title: memory.title }))) : null;
    return h("li", { class: `card${memory.enabled ? "" : " off"}${pick ? " pickable" : ""}`, "data-memory-id": memory.id },
      select,
      h("h3", { id: titleId, tabindex: -1 }, memory.title),
      h("p", {}, h("span", { class: `badge source-${memory.source}` }, t(`source.${memory.source}`)),
        h("span", { class: "badge" }, cat(memory.category)),
        memory.subcategory ? h("span", { class: "badge" }, subcat(memory.subcategory)) : null,
        memory.enabled ? null : h("span", { class: "badge" }, t("disabled")),
        memory.conflict_with ? h("span", { class: "badge conflict" },
          memory.conflict_yields ? t("conflictHeld") : t("conflictOpen")) : null),
      h("p", {}, memory.content),
      h("p", { class: "help" }, `${t("evidenceLine", { count: tn("evidenceCount", memory.hits) })} · ${when(memory.created_at, true)}`),
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
      api("GET", "/v1/profile/history", as()),
    ]).then(([profile, all, weeks]) => {
      // Scores add up with every mention (no upper bound): bars are scaled against the
      // highest score of the list.
      const scored = (items, label) => items && items.length
        ? bars(items.map((x) => [`${x.text} (${tn("evidenceCount", x.hits)})`,
          Number(x.effective_score ?? x.score).toFixed(2)]), label)
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
        h("section", { class: "panel", "aria-labelledby": "time-h" },
          h("h2", { id: "time-h" }, t("overTime")), h("p", { class: "help" }, t("overTimeHelp")),
          timeline(weeks.data || [])),
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

  // The profile over time, month by month: the top traits and topics of the month's weeks
  // (a week belongs to the month its Thursday falls in; a text's best score counts).
  const TOP_PER_MONTH = 3;
  function monthOf(week) {
    const [year, num] = week.split("-W").map(Number);
    const jan4 = new Date(Date.UTC(year, 0, 4));
    const thursday = new Date(jan4.getTime() + ((num - 1) * 7 + 3 - ((jan4.getUTCDay() + 6) % 7)) * 86400000);
    return thursday.toISOString().slice(0, 7);
  }
  function timeline(weeks) {
    const months = new Map();
    for (const week of weeks) {
      const month = monthOf(week.week);
      const entry = months.get(month) || { traits: new Map(), topics: new Map() };
      for (const kind of ["traits", "topics"]) {
        for (const tag of week[kind] || []) {
          entry[kind].set(tag.text, Math.max(entry[kind].get(tag.text) || 0, Number(tag.score) || 0));
        }
      }
      months.set(month, entry);
    }
    const top = (scores) => [...scores.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
      .slice(0, TOP_PER_MONTH).map(([text]) => text).join(", ") || "—";
    const rows = [...months.entries()].map(([month, e]) => [month, top(e.topics), top(e.traits)]);
    return h("div", { class: "profile-timeline" },
      table([t("month"), t("topics"), t("traits")], rows, t("overTime")));
  }

  // Conflicts: pairs of contradicting memories for the person to settle. The admin view
  // lists them with the admin route (GET /v1/admin/conflicts?user=).
  function conflictsTab(panel, ctx, as) {
    const filter = h("select", {}, ["open", "settled", "all"].map((k) =>
      h("option", { value: k }, t(`conflictStatus.${k}`))));
    const list = h("ul", { class: "cards", "aria-labelledby": "conf-h" });
    let latest = 0; // only the newest load draws: an earlier answer arriving late is dropped
    async function load() {
      const mine = ++latest;
      list.replaceChildren(h("li", {}, t("loading")));
      try {
        const found = ctx.admin
          ? await api("GET", "/v1/admin/conflicts", { query: { user: ctx.user, status: filter.value } })
          : await api("GET", "/v1/memories/conflicts", as({ query: { status: filter.value } }));
        if (mine !== latest) return;
        list.replaceChildren(...(found.data.length ? found.data.map((c) => conflictCard(c, as, load))
          : [h("li", { class: "help" }, t("noConflicts"))]));
      } catch (err) { if (mine === latest) failed(err, list); }
    }
    filter.addEventListener("change", load);
    panel.append(h("section", { class: "panel" },
      h("h2", { id: "conf-h" }, t("conflicts")), h("p", { class: "help" }, t("conflictsHelp")),
      field(t("show"), filter), list));
    load();
  }
  function conflictCard(c, as, reload) {
    const titleId = nextId("conf");
    const side = (label, m) => h("div", { class: "conflict-side" },
      h("h4", {}, label), h("p", {}, m.content),
      h("p", { class: "help" }, `${tn("evidenceCount", m.hits)} · ${when(m.created_at, true)}`,
        m.conflict_yields ? ` · ${t("conflictHeld")}` : ""));
    const settle = (verb, label) => h("button", { type: "button", "aria-describedby": titleId,
      onclick: async () => {
        try {
          await api("POST", `/v1/memories/conflicts/${encodeURIComponent(c.id)}/${verb}`, as());
          status(t("done"));
          reload();
        } catch (err) { failed(err); }
      } }, label);
    const open = c.status === "open" || c.status === "unconfirmed";
    return h("li", { class: `card conflict-${c.kind}`, "data-conflict-id": c.id },
      h("h3", { id: titleId }, c.kind === "contradicts" ? t("conflictUnsure") : t("conflictReplaced")),
      h("p", {}, h("span", { class: "badge conflict" }, t(`conflictKind.${c.kind}`)),
        h("span", { class: "badge" }, t(`conflictState.${c.status}`))),
      h("div", { class: "conflict-pair" },
        side(c.kind === "contradicts" ? t("conflictOlder") : t("conflictRetired"), c.retired),
        side(t("conflictNewer"), c.successor)),
      h("p", { class: "help" }, `${when(c.created_at)} · ${c.reason}`),
      open ? h("div", { class: "actions" }, settle("confirm", t("keepNew")), settle("reverse", t("keepOld"))) : null);
  }

  function factList(facts) {
    if (!facts.length) return h("p", { class: "help" }, t("none"));
    return h("ul", { class: "cards" }, facts.map((f) => {
      const events = Array.isArray(f.timeline) ? f.timeline : [];
      return h("li", { class: "card" },
        h("h3", {}, f.title || f.content || f.text),
        f.title && f.content ? h("p", {}, f.content) : null,
        h("p", { class: "help" }, t("evidenceLine", { count: tn("evidenceCount", f.hits ?? 1) })),
        h("ol", { class: "timeline", "aria-label": t("lastSeen") },
          events.length ? events.map((e) => h("li", {}, `${when(e.at || e.date)} · ${e.action || e.event || e.kind || ""}`))
            : [h("li", {}, `${t("firstSeen")}: ${when(f.first_seen || f.created_at)}`),
              h("li", {}, `${t("lastSeen")}: ${when(f.last_seen || f.last_seen_at)}`)]));
    }));
  }

  // "Test recall": what recall would inject for a message now (POST /v1/memories/preview,
  // which changes nothing), and a reply's injection by its X-Memory-Injection-Id.
  function recallTab(panel, as) {
    const message = h("textarea", { rows: 3 });
    const previewOut = h("div", { "aria-live": "polite" });
    const injectionId = h("input", { type: "text", autocomplete: "off", spellcheck: "false" });
    const injectionOut = h("div", { "aria-live": "polite" });
    async function items(list, caption) {
      if (!list.length) return h("p", { class: "help" }, t("nothingInjected"));
      // Records hold ids only: the console looks each memory up to show its title.
      const titles = await Promise.all(list.map((item) => item.kind !== "memory" ? null
        : api("GET", `/v1/memories/${encodeURIComponent(item.memory_id)}`, as())
          .then((m) => m.title, () => t("memoryGone"))));
      return table([t("rank"), t("injectedItem"), t("itemScore"), t("reasons")], list.map((item, i) => [
        String(item.rank),
        item.kind === "memory" ? `${titles[i]} (${item.memory_id})` : `${t("profile")}: ${item.field}`,
        Number(item.score).toFixed(3),
        item.reasons.map((r) => t(`reason.${r}`)).join(", ")]), caption);
    }
    const preview = h("form", { class: "panel", "aria-labelledby": "recall-h", onsubmit: async (e) => {
      e.preventDefault();
      previewOut.replaceChildren(h("p", {}, t("loading")));
      try {
        const shown = await api("POST", "/v1/memories/preview", as({ body: {
          messages: [{ role: "user", content: message.value }] } }));
        previewOut.replaceChildren(h("p", { class: "help" }, t("previewStatus", { status: shown.status })),
          await items(shown.items, t("testRecall")));
      } catch (err) { failed(err, previewOut); }
    } },
    h("h2", { id: "recall-h" }, t("testRecall")),
    h("p", { class: "help" }, t("testRecallHelp")),
    field(t("recallMessage"), message),
    h("button", { type: "submit" }, t("testRecall")), previewOut);
    const lookup = h("form", { class: "panel", "aria-labelledby": "inj-h", onsubmit: async (e) => {
      e.preventDefault();
      injectionOut.replaceChildren(h("p", {}, t("loading")));
      try {
        const record = await api("GET", `/v1/memories/injections/${encodeURIComponent(injectionId.value.trim())}`, as());
        injectionOut.replaceChildren(h("dl", { class: "facts" },
          h("dt", {}, t("when")), h("dd", {}, when(record.created_at)),
          h("dt", {}, t("model")), h("dd", {}, record.request.model),
          h("dt", {}, t("sourceConversation")), h("dd", {}, record.request.conversation_id || "—"),
          h("dt", {}, t("channel")), h("dd", {}, record.request.channel)),
        await items(record.items, t("replyInjection")));
      } catch (err) { failed(err, injectionOut); }
    } },
    h("h2", { id: "inj-h" }, t("replyInjection")),
    h("p", { class: "help" }, t("replyInjectionHelp")),
    field(t("injectionId"), injectionId),
    h("button", { type: "submit" }, t("showInjection")), injectionOut);
    panel.append(preview, lookup);
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
    const importResult = h("div", { class: "help", "aria-live": "polite" });
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
          const rejected = result.rejected || [];
          // Each refused item with its place in the file (1-based) and the API's reason.
          importResult.replaceChildren(h("p", {}, t("importResult", { imported: result.imported,
            merged: result.merged, rejected: rejected.length })),
          rejected.length ? h("ul", { "aria-label": t("rejectedItems") }, rejected.map((r) =>
            h("li", {}, t("rejectedItem", { n: Number(r.index) + 1,
              reason: r.message ? `${r.message} (${r.reason})` : r.reason })))) : null);
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
          status(tn("cleared", result.deleted));
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
    // tenant's stats and usage at a time (?tenant=, named in the field above the tabs);
    // every other admin route (prompts, dead letters, users, settings) refuses it.
    const global = session.me.role === "global_admin";
    const heading = h("h2", { tabindex: -1 }, global ? t("roleGlobal") : t("roleAdmin", session.me));
    const defs = global ? [
      { label: t("tabOverview"), render: overviewTab },
      { label: t("tabShared"), render: sharedTab },
      { label: t("tabUsage"), render: usageTab },
    ] : [
      { label: t("tabOverview"), render: overviewTab },
      { label: t("tabPrompts"), render: promptsTab },
      { label: t("tabShared"), render: sharedTab },
      { label: t("tabUsers"), render: usersTab },
      { label: t("tabSettings"), render: settingsTab },
      { label: t("tabSynonyms"), render: synonymsTab },
      { label: t("tabUsage"), render: usageTab },
      { label: t("tabDead"), render: deadTab },
    ];
    // A global admin picks the tenant from those the configuration names (GET /v1/me
    // lists them); the first one is open from the start.
    const known = global ? (session.me.tenants || []) : [];
    if (global && !session.tenant && known.length) session.tenant = known[0];
    let view = tabs(t("title"), defs);
    let tenantForm = null;
    if (global) {
      const input = known.length
        ? h("select", {}, known.map((name) => h("option", { value: name, selected: name === session.tenant }, name)))
        : h("input", { type: "text", autocomplete: "off", value: session.tenant || "" });
      tenantForm = h("form", { class: "row", onsubmit: (event) => {
        event.preventDefault();
        session.tenant = input.value.trim();
        const fresh = tabs(t("title"), defs);
        view.replaceWith(fresh);
        view = fresh;
      } }, h("div", { class: "grow" }, field(t("tenant"), input,
        known.length ? t("tenantHelp") : t("tenantNone"))),
      h("button", { type: "submit" }, t("open")));
      input.addEventListener("change", () => { if (input.tagName === "SELECT") tenantForm.requestSubmit(); });
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
    // One bar per day (learned memories) over a y axis (0 … the busiest day) and an x axis
    // labelled with the first, middle and last dates; the table below has every value.
    const width = 400, height = 190, left = 36, bottom = 30, top = 10, right = 6, gap = 1;
    const plotW = width - left - right, plotH = height - top - bottom;
    const max = Math.max(1, ...daily.map((d) => d.learned || 0));
    const step = plotW / Math.max(1, daily.length);
    const total = daily.reduce((sum, d) => sum + (d.learned || 0), 0);
    const ns = "http://www.w3.org/2000/svg";
    const el = (tag, attrs, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
      if (text !== undefined) node.textContent = text;
      return node;
    };
    const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
      "aria-label": t("trendLabel", { days, total }) });
    const day = (iso) => {
      const d = new Date(`${iso}T00:00:00Z`);
      return Number.isNaN(d.getTime()) ? iso : d.toLocaleDateString(LANG === "zh" ? "zh-CN" : "en-US",
        { month: "short", day: "numeric", timeZone: "UTC" });
    };
    const axes = el("g", { class: "axes", "aria-hidden": "true" });
    axes.append(el("line", { x1: left, y1: top, x2: left, y2: top + plotH }),
      el("line", { x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH }));
    for (const tick of [...new Set([0, Math.round(max / 2), max])]) {
      const y = top + plotH - (tick / max) * plotH;
      axes.append(el("line", { x1: left - 5, y1: y, x2: left, y2: y }),
        el("text", { x: left - 7, y: y + 5, "text-anchor": "end", class: "y-tick" }, String(tick)));
    }
    const labelled = [...new Set([0, Math.floor((daily.length - 1) / 2), daily.length - 1])].filter((i) => i >= 0);
    for (const i of labelled) {
      const x = left + i * step + step / 2;
      const anchor = i === 0 ? "start" : i === daily.length - 1 ? "end" : "middle";
      axes.append(el("text", { x: i === 0 ? left : i === daily.length - 1 ? left + plotW : x,
        y: height - 6, "text-anchor": anchor, class: "x-tick" }, day(daily[i].date)));
    }
    svg.append(axes);
    daily.forEach((d, i) => {
      const barHeight = Math.max(d.learned ? 2 : 0, ((d.learned || 0) / max) * plotH);
      const rect = el("rect", { x: left + i * step + gap / 2, y: top + plotH - barHeight,
        width: Math.max(1, step - gap), height: barHeight });
      rect.append(el("title", {}, `${d.date}: ${d.learned || 0}`));
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
            t("learningTokens"), t("recallTokens"), t("userTokens"), t("activeUsers")],
          daily.map((d) => [d.date, d.learned, d.merged, d.retired, d.rejected,
            d.learning_tokens, d.recall_tokens ?? 0, d.user_tokens, d.active_users]), t("trend"))));
    }).catch((err) => failed(err, stats));
    panel.append(...[stats, session.me.role === "global_admin" ? null : auditLog()].filter(Boolean));
  }

  // The memories the learning log names, read once each: "user/id" → memory, or null
  // when it is gone (deleted or erased). Shared and system memories have no user here.
  const logMemories = new Map();
  async function describeMemories(events) {
    const wanted = [...new Set(events.filter((e) => e.memory_id && e.user_id)
      .map((e) => `${e.user_id}/${e.memory_id}`))].filter((k) => !logMemories.has(k));
    for (let i = 0; i < wanted.length; i += 8) {  // a few requests at a time
      await Promise.all(wanted.slice(i, i + 8).map(async (k) => {
        const [user, id] = [k.slice(0, k.lastIndexOf("/")), k.slice(k.lastIndexOf("/") + 1)];
        try {
          logMemories.set(k, await api("GET", `/v1/memories/${encodeURIComponent(id)}`, { user }));
        } catch (err) {
          // Gone (404) reads "deleted"; any other failure shows the bare id, never
          // hides the log.
          logMemories.set(k, err.status === 404 ? null : undefined);
        }
      }));
    }
  }
  function memoryCell(e) {
    if (!e.memory_id) return "";
    const memory = e.user_id ? logMemories.get(`${e.user_id}/${e.memory_id}`) : undefined;
    if (!memory) {
      return h("span", { class: "help" }, memory === null ? t("memoryGone") : "", h("code", {}, e.memory_id));
    }
    const text = memory.content.length > 120 ? `${memory.content.slice(0, 119)}…` : memory.content;
    return h("div", { class: "log-memory" },
      h("button", { type: "button", class: "link", "aria-label": t("openMemory", { title: memory.title, user: e.user_id }),
        onclick: () => userView({ user: e.user_id, header: e.user_id, admin: true, focus: memory.id, back: 0 }) },
      memory.title),
      h("p", { class: "help" }, text),
      memory.superseded_at ? h("span", { class: "badge" }, t("retired")) : null);
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
        await describeMemories(seen);
        rows.replaceChildren(seen.length ? table(
          [t("at"), t("user"), t("action"), t("memory"), t("conversation"), t("actor"), t("reason")],
          seen.map((e) => [when(e.at), e.user_id || "—", e.action, memoryCell(e), e.conversation_id || "—",
            e.actor, e.reason || ""]), t("learningLog")) : h("p", { class: "help" }, t("none")));
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
    // Shared memories are the tenant admin's; system memories are written only with a
    // global admin key (a tenant admin reads them: no form that could only answer 403).
    const global = session.me.role === "global_admin";
    const scopes = global ? ["system"] : ["shared", "system"];
    for (const scope of scopes) {
      const writable = scope === "shared" || global;
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
          list.replaceChildren(...(page.data.length ? page.data.map((m) => adminMemoryCard(m, load, writable))
            : [h("li", { class: "help" }, t("none"))]));
        } catch (err) { failed(err, list); }
      };
      panel.append(h("section", { class: "panel", "aria-labelledby": hid },
        h("h2", { id: hid }, title), list,
        writable ? null : h("p", { class: "help" }, t("systemReadOnly")),
        writable ? h("h3", {}, t("addMemory")) : null,
        writable ? h("form", { onsubmit: async (event) => {
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
        } }, content, memTitle, category, h("div", { class: "actions" }, h("button", { type: "submit" }, t("add")))) : null));
      load();
    }
  }

  function adminMemoryCard(memory, reload, writable) {
    const titleId = nextId("mem");
    const path = `/v1/admin/memories/${encodeURIComponent(memory.id)}`;
    const act = (label, run, cls) => h("button", { type: "button", class: cls || "quiet",
      "aria-describedby": titleId, onclick: async () => {
        try { if (await run() !== false) await reload(); } catch (err) { failed(err); }
      } }, label);
    return h("li", { class: memory.enabled === false ? "card off" : "card" },
      h("h3", { id: titleId }, memory.title),
      h("p", {}, h("span", { class: "badge" }, t(`scope.${memory.scope}`)), h("span", { class: "badge" }, cat(memory.category)),
        memory.subcategory ? h("span", { class: "badge" }, subcat(memory.subcategory)) : null),
      h("p", {}, memory.content),
      h("details", {}, h("summary", {}, t("details")), h("dl", { class: "facts" },
        h("dt", {}, t("source")), h("dd", {}, memory.source || "—"),
        h("dt", {}, t("firstSeen")), h("dd", {}, when(memory.created_at)),
        h("dt", {}, t("lastSeen")), h("dd", {}, when(memory.last_seen_at)))),
      writable ? h("div", { class: "actions" },
        act(t("edit"), () => editMemory(memory, path, (o) => o || {})),
        act(t("delete"), async () => {
          if (!await confirmAction(t("deleteOne", { title: memory.title }), t("delete"))) return false;
          await api("DELETE", path);
          status(t("done"));
          return true;
        }, "danger")) : null);
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
        rows.replaceChildren(seen.length ? table([t("user"), t("enabledMemories"), t("lastSeenCol"), ""],
          seen.map((u) => [u.user, u.memories, when(u.last_seen),
            h("button", { type: "button", class: "quiet", "aria-label": `${t("open")} ${u.user}`,
              onclick: () => userView({ user: u.user, header: u.user, admin: true }) }, t("open"))]),
          t("users")) : h("p", { class: "help" }, t("none")));
      } catch (err) { failed(err, rows); }
    }
    more.addEventListener("click", load);
    const input = h("input", { type: "text", autocomplete: "off" });
    panel.append(h("section", { class: "panel", "aria-labelledby": "users-h" },
      h("h2", { id: "users-h" }, t("users")), h("p", { class: "help" }, t("usersHelp")), rows, more,
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

  // The run-time settings the Settings tab edits, by their config.yaml names: "pair" and
  // "budget" are objects edited as one number field per key (a budget cap left empty is
  // no cap); every other setting is one field of its type.
  const SETTINGS = [
    { name: "learning.enabled", type: "bool" },
    { name: "learning.score_threshold", type: "float" },
    { name: "learning.batch_messages", type: "pair", parts: ["private", "group"] },
    { name: "learning.max_memory_per_user", type: "int" },
    { name: "learning.retention_days", type: "int" },
    { name: "learning.model", type: "text" },
    { name: "memory.injection_count", type: "int" },
    { name: "memory.token_budget_percent", type: "float" },
    { name: "learning.budget", type: "budget", parts: ["tokens_per_day", "tokens_per_month"] },
  ];

  function numberInput(kind, value) {
    return h("input", { type: "number", step: kind === "float" ? "any" : "1", min: kind === "float" ? null : "0",
      inputmode: kind === "float" ? "decimal" : "numeric", value: value ?? "" });
  }

  function settingControls(setting, value) {
    // {wraps: {dotted path → field}, read(): the value to send or an Error naming the path}
    const { name, type } = setting;
    if (type === "bool") {
      const control = h("input", { type: "checkbox", checked: Boolean(value), id: nextId("f") });
      const error = h("p", { class: "field-error", id: nextId("err"), hidden: true });
      const wrap = h("div", { class: "field" },
        h("label", { class: "check", for: control.id }, control, h("span", {}, t(`set.${name}`))), error);
      wrap.control = control;
      wrap.error = error;
      return { wraps: { [name]: wrap }, read: () => control.checked };
    }
    if (type === "text") {
      const wrap = field(t(`set.${name}`), h("input", { type: "text", value: value ?? "" }));
      return { wraps: { [name]: wrap }, read: () => wrap.control.value };
    }
    const parts = setting.parts || [null];
    const wraps = {};
    for (const part of parts) {
      const path = part ? `${name}.${part}` : name;
      const current = part ? (value || {})[part] : value;
      wraps[path] = field(t(`set.${path}`), numberInput(type === "float" ? "float" : "int", current));
    }
    const number = (path) => {
      const raw = wraps[path].control.value.trim();
      if (raw === "") {
        if (type === "budget") return null;
        return new FieldProblem(path, t("numberRequired"));
      }
      const n = Number(raw);
      return Number.isFinite(n) ? n : new FieldProblem(path, t("numberRequired"));
    };
    const read = () => {
      if (!setting.parts) return number(name);
      const out = {};
      for (const part of parts) {
        const n = number(`${name}.${part}`);
        if (n instanceof FieldProblem) return n;
        out[part] = n;
      }
      return out;
    };
    return { wraps, read };
  }
  function shownValue(setting, value) {
    // A setting's value in words: on/off, "Private chats 5 · Group chats 25", "no cap".
    if (value === null || value === undefined) return setting.type === "budget" ? t("noCapShort") : "—";
    if (setting.type === "bool") return t(value ? "on" : "off");
    if (setting.parts) {
      return setting.parts.map((part) => `${t(`set.${setting.name}.${part}`)} ${value[part] ?? t("noCapShort")}`).join(" · ");
    }
    return String(value);
  }
  class FieldProblem {
    constructor(path, message) { this.path = path; this.message = message; }
  }

  function settingsTab(panel) {
    const box = h("section", { class: "panel", "aria-labelledby": "set-h" },
      h("h2", { id: "set-h" }, t("settings")), h("p", {}, t("loading")));
    panel.append(box);
    const load = async () => {
      try {
        const answer = await api("GET", "/v1/admin/settings");
        const current = answer.settings || {};
        const overrides = answer.overrides || {};
        const wraps = {};
        const controls = {};
        const initial = {};
        const blocks = SETTINGS.map((setting) => {
          const { name } = setting;
          const value = lookup(current, name);
          const made = settingControls(setting, value);
          controls[name] = made;
          Object.assign(wraps, made.wraps);
          initial[name] = JSON.stringify(made.read());
          const overridden = Object.prototype.hasOwnProperty.call(overrides, name);
          const label = t(`set.${name}`);
          const origin = h("p", { class: "origin" },
            h("span", { class: overridden ? "badge override" : "badge" },
              overridden ? t("overridden") : t("fromConfig")),
            overridden && answer.defaults && name in answer.defaults
              ? h("span", { class: "help" }, t("configValue", { value: shownValue(setting, answer.defaults[name]) })) : null,
            overridden ? h("button", { type: "button", class: "quiet small", "aria-label": t("resetOne", { name: label }),
              onclick: async () => {
                try {
                  await api("PATCH", "/v1/admin/settings", { body: { [name]: null } });
                  await load();
                  status(t("resetDone", { name: label }));
                } catch (err) { failed(err); }
              } }, t("reset")) : null);
          const fields = Object.values(made.wraps);
          return setting.parts
            ? h("fieldset", { class: "setting" }, h("legend", {}, label), fields, origin)
            : h("div", { class: "setting" }, fields, origin);
        });
        const target = (param) => wraps[param]
          || wraps[Object.keys(wraps).find((p) => p.startsWith(`${param}.`))]
          || wraps[Object.keys(wraps).find((p) => String(param || "").startsWith(`${p}.`))];
        box.replaceChildren(h("h2", { id: "set-h" }, t("settings")), h("p", { class: "help" }, t("settingsHelp")),
          h("form", { novalidate: true, onsubmit: async (event) => {
            event.preventDefault();
            Object.values(wraps).forEach(clearFieldError);
            const patch = {};
            for (const { name } of SETTINGS) {
              const value = controls[name].read();
              if (value instanceof FieldProblem) { showFieldError(wraps[value.path], value.message); return; }
              if (JSON.stringify(value) !== initial[name]) patch[name] = value;
            }
            if (!Object.keys(patch).length) { status(t("saved")); return; }
            try {
              await api("PATCH", "/v1/admin/settings", { body: patch });
              await load();
              status(t("saved"));
            } catch (err) {
              // param is the dotted path of the bad value (learning.batch_messages.private).
              const wrap = target(err.param);
              if (wrap) showFieldError(wrap, err.message); else failed(err);
            }
          } }, blocks, h("div", { class: "actions" }, h("button", { type: "submit" }, t("save")))));
      } catch (err) { failed(err, box); }
    };
    load();
  }

  function usageTab(panel) {
    const group = h("select", {}, ["day", "model", "user"].map((g) =>
      h("option", { value: g }, t(g === "user" ? "user" : g))));
    const since = field(t("since"), h("input", { type: "date" }));
    const until = field(t("until"), h("input", { type: "date" }));
    const rows = h("div", {}, h("p", {}, t("loading")));
    const sum = (o) => Object.values(o || {}).reduce((a, b) => a + (Number(b) || 0), 0);
    const split = (o) => Object.entries(o || {}).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ");
    async function load() {
      [since, until].forEach(clearFieldError);
      try {
        const page = await api("GET", "/v1/admin/usage", { query: tenantQuery({ group_by: group.value,
          since: since.control.value, until: until.control.value }) });
        const total = { requests: 0, prompt: 0, completion: 0, memory: 0, recall: 0, learning: {} };
        for (const r of page.data) {
          total.requests += r.requests;
          total.prompt += r.user_tokens.prompt;
          total.completion += r.user_tokens.completion;
          total.memory += r.memory_tokens;
          total.recall += r.recall_tokens ?? 0;
          for (const [k, v] of Object.entries(r.learning_tokens || {})) total.learning[k] = (total.learning[k] || 0) + v;
        }
        const line = (key, r) => [key, r.requests, r.prompt, r.completion, r.memory, r.recall,
          `${sum(r.learning)} (${split(r.learning)})`];
        rows.replaceChildren(page.data.length ? table(
          [t(group.value === "user" ? "user" : group.value), t("requests"), `${t("userTokens")} (${t("promptTokens")})`,
            `${t("userTokens")} (${t("completionTokens")})`, t("memoryTokens"), t("recallTokens"),
            t("learningTokens")],
          [...page.data.map((r) => line(r.key ?? "—", { requests: r.requests, prompt: r.user_tokens.prompt,
            completion: r.user_tokens.completion, memory: r.memory_tokens,
            recall: r.recall_tokens ?? 0, learning: r.learning_tokens })),
          line(h("strong", {}, t("total")), total)], t("usage"))
          : h("p", { class: "help" }, t("none")));
      } catch (err) {
        const wrap = { since, until }[err.param];
        if (wrap) showFieldError(wrap, err.message); else failed(err, rows);
      }
    }
    group.addEventListener("change", load);
    panel.append(h("section", { class: "panel", "aria-labelledby": "use-h" },
      h("h2", { id: "use-h" }, t("usage")),
      h("form", { class: "row", "aria-label": t("filters"), onsubmit: (e) => { e.preventDefault(); load(); } },
        h("div", { class: "grow" }, field(t("groupBy"), group)),
        h("div", { class: "grow" }, since), h("div", { class: "grow" }, until),
        h("button", { type: "submit" }, t("apply"))),
      rows));
    load();
  }

  function deadTab(panel) {
    const rows = h("div", {}, h("p", {}, t("loading")));
    const transcript = (d) => (d.messages && d.messages.length
      ? h("details", {}, h("summary", {}, tn("messageCount", d.messages.length)),
        h("ol", { class: "transcript" }, d.messages.map((m) => h("li", {},
          h("strong", {}, `${m.name || t(`role.${m.role}`)}: `), m.text))))
      : "—");
    async function load() {
      try {
        const page = await api("GET", "/v1/admin/dead-letters");
        const path = (d) => `/v1/admin/dead-letters/${encodeURIComponent(d.id)}`;
        rows.replaceChildren(page.data.length ? table(
          [t("failedAt"), t("user"), t("conversation"), t("kind"), t("attempts"), t("lastError"), t("messages"), ""],
          page.data.map((d) => [when(fromEpoch(d.failed_at)), d.user || "—", d.conversation || "—", d.kind,
            d.attempts, h("span", { class: "error-text" }, d.last_error), transcript(d), h("div", { class: "actions" },
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
      h("h2", { id: "dead-h" }, t("deadLetters")), h("p", { class: "help" }, t("deadHelp")), rows));
    load();
  }

  function synonymsTab(panel) {
    // Candidate synonyms mined from merged traits and topics; accepted ones join the
    // tenant's learning.synonyms (shown below the list).
    const filter = h("select", {}, ["open", "accepted", "rejected", "all"].map((s) =>
      h("option", { value: s }, t(`synStatus.${s}`))));
    const rows = h("div", {}, h("p", {}, t("loading")));
    const groups = h("div", {});
    const examples = (c) => (c.examples.length
      ? h("details", {}, h("summary", {}, tn("exampleCount", c.examples.length)),
        h("ul", {}, c.examples.map((e) => h("li", {},
          `${t(e.field)}: “${e.said}” → “${e.kept}” (${t(`synHow.${e.how}`)}, ${when(e.at)})`))))
      : "—");
    async function load() {
      try {
        const page = await api("GET", "/v1/admin/synonyms/candidates", { query: { status: filter.value } });
        const path = (c, verb) => `/v1/admin/synonyms/candidates/${encodeURIComponent(c.id)}/${verb}`;
        const decide = (c, verb) => async () => {
          try { await api("POST", path(c, verb)); status(t("done")); await load(); } catch (err) { failed(err); }
        };
        rows.replaceChildren(page.data.length ? table(
          [t("synWords"), t("synCount"), t("synExamples"), t("synState"), ""],
          page.data.map((c) => [c.words.join(" / "), c.count, examples(c), t(`synStatus.${c.status}`),
            h("div", { class: "actions" },
              c.status === "accepted" ? null : h("button", { type: "button", class: "quiet",
                "aria-label": `${t("accept")} ${c.words.join(" / ")}`, onclick: decide(c, "accept") }, t("accept")),
              c.status === "rejected" ? null : h("button", { type: "button", class: "quiet",
                "aria-label": `${t("reject")} ${c.words.join(" / ")}`, onclick: decide(c, "reject") }, t("reject")))]),
          t("synonyms")) : h("p", { class: "help" }, t("none")));
        const settings = await api("GET", "/v1/admin/settings");
        const mine = (settings.overrides || {})["learning.synonyms"] || [];
        groups.replaceChildren(h("h3", {}, t("synGroups")), mine.length
          ? h("ul", { class: "synonym-groups" }, mine.map((g) => h("li", {}, g.join(" / "))))
          : h("p", { class: "help" }, t("none")));
      } catch (err) { failed(err, rows); }
    }
    filter.addEventListener("change", load);
    panel.append(h("section", { class: "panel", "aria-labelledby": "syn-h" },
      h("h2", { id: "syn-h" }, t("synonyms")), h("p", { class: "help" }, t("synonymsHelp")),
      h("div", { class: "row" }, h("div", { class: "grow" }, field(t("synState"), filter))), rows, groups));
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
