import { LabIcon } from '@jupyterlab/ui-components';

/** A GPU board: drawn with the theme's icon colour class so it follows light and dark themes. */
const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M2 6h17a2 2 0 0 1 2 2v8a2 2 0 0 1-2 2h-5v2h-2v-2H8v2H6v-2H4v3H2V6zm2 2v8h15V8H4z"/>
    <circle cx="9" cy="12" r="2.6"/>
    <rect x="13" y="9.5" width="4" height="5" rx="0.6"/>
    <rect x="21" y="10" width="2" height="4"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'gpuctx:gpu', svgstr });
